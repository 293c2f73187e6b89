from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaderConfigChange(_message.Message):
    __slots__ = ("node_id", "raft_addr", "grpc_addr", "http_addr")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    raft_addr: str
    grpc_addr: str
    http_addr: str
    def __init__(self, node_id: _Optional[str] = ..., raft_addr: _Optional[str] = ..., grpc_addr: _Optional[str] = ..., http_addr: _Optional[str] = ...) -> None: ...

class GenerateIDsRequest(_message.Message):
    __slots__ = ("number",)
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    number: int
    def __init__(self, number: _Optional[int] = ...) -> None: ...

class GenerateIDsResponse(_message.Message):
    __slots__ = ("success", "ids")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, success: _Optional[bool] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class QueueSettings(_message.Message):
    __slots__ = ("strategy", "max_unacked", "ack_timeout", "max_deliveries", "dead_letter_queue", "max_messages", "overflow", "dedup_window", "backoff_initial", "backoff_max", "message_ttl", "max_in_flight", "group_rate", "group_burst")
    class Strategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STRATEGY_UNSPECIFIED: _ClassVar[QueueSettings.Strategy]
        ROUND_ROBIN: _ClassVar[QueueSettings.Strategy]
        WEIGHTED: _ClassVar[QueueSettings.Strategy]
    STRATEGY_UNSPECIFIED: QueueSettings.Strategy
    ROUND_ROBIN: QueueSettings.Strategy
    WEIGHTED: QueueSettings.Strategy
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MAX_UNACKED_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_INITIAL_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TTL_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    GROUP_RATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_BURST_FIELD_NUMBER: _ClassVar[int]
    strategy: QueueSettings.Strategy
    max_unacked: int
    ack_timeout: int
    max_deliveries: int
    dead_letter_queue: str
    max_messages: int
    overflow: str
    dedup_window: int
    backoff_initial: int
    backoff_max: int
    message_ttl: int
    max_in_flight: int
    group_rate: float
    group_burst: int
    def __init__(self, strategy: _Optional[_Union[QueueSettings.Strategy, str]] = ..., max_unacked: _Optional[int] = ..., ack_timeout: _Optional[int] = ..., max_deliveries: _Optional[int] = ..., dead_letter_queue: _Optional[str] = ..., max_messages: _Optional[int] = ..., overflow: _Optional[str] = ..., dedup_window: _Optional[int] = ..., backoff_initial: _Optional[int] = ..., backoff_max: _Optional[int] = ..., message_ttl: _Optional[int] = ..., max_in_flight: _Optional[int] = ..., group_rate: _Optional[float] = ..., group_burst: _Optional[int] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "type", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    settings: QueueSettings
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("group", "id", "priority", "content", "metadata", "deliveries", "last_error", "expires_at", "delivery")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    group: str
    id: int
    priority: int
    content: str
    metadata: _containers.ScalarMap[str, str]
    deliveries: int
    last_error: str
    expires_at: int
    delivery: str
    def __init__(self, group: _Optional[str] = ..., id: _Optional[int] = ..., priority: _Optional[int] = ..., content: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., deliveries: _Optional[int] = ..., last_error: _Optional[str] = ..., expires_at: _Optional[int] = ..., delivery: _Optional[str] = ...) -> None: ...

class LeaderConfiguration(_message.Message):
    __slots__ = ("node_id", "raft_addr", "grpc_addr", "http_addr")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDR_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    raft_addr: str
    grpc_addr: str
    http_addr: str
    def __init__(self, node_id: _Optional[str] = ..., raft_addr: _Optional[str] = ..., grpc_addr: _Optional[str] = ..., http_addr: _Optional[str] = ...) -> None: ...

class SnapshotItem(_message.Message):
    __slots__ = ("queue", "message", "leader_configuration")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    message: Message
    leader_configuration: LeaderConfiguration
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., leader_configuration: _Optional[_Union[LeaderConfiguration, _Mapping]] = ...) -> None: ...

class CreateQueueRequest(_message.Message):
    __slots__ = ("name", "type", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    settings: QueueSettings
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class CreateQueueResponse(_message.Message):
    __slots__ = ("success", "existed", "type", "settings", "dead_letter_queue_hidden")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    success: bool
    existed: bool
    type: str
    settings: QueueSettings
    dead_letter_queue_hidden: bool
    def __init__(self, success: _Optional[bool] = ..., existed: _Optional[bool] = ..., type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ..., dead_letter_queue_hidden: _Optional[bool] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ("name", "settings")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    settings: QueueSettings
    def __init__(self, name: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ...) -> None: ...

class UpdateQueueResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("enqueueRPS", "dequeueRPS", "ackRPS", "nackRPS")
    ENQUEUERPS_FIELD_NUMBER: _ClassVar[int]
    DEQUEUERPS_FIELD_NUMBER: _ClassVar[int]
    ACKRPS_FIELD_NUMBER: _ClassVar[int]
    NACKRPS_FIELD_NUMBER: _ClassVar[int]
    enqueueRPS: float
    dequeueRPS: float
    ackRPS: float
    nackRPS: float
    def __init__(self, enqueueRPS: _Optional[float] = ..., dequeueRPS: _Optional[float] = ..., ackRPS: _Optional[float] = ..., nackRPS: _Optional[float] = ...) -> None: ...

class GetQueueResponse(_message.Message):
    __slots__ = ("name", "type", "settings", "stats", "ready", "unacked", "total", "paused", "paused_groups", "dead_letter_queue_hidden")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    UNACKED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    settings: QueueSettings
    stats: Stats
    ready: int
    unacked: int
    total: int
    paused: bool
    paused_groups: int
    dead_letter_queue_hidden: bool
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., settings: _Optional[_Union[QueueSettings, _Mapping]] = ..., stats: _Optional[_Union[Stats, _Mapping]] = ..., ready: _Optional[int] = ..., unacked: _Optional[int] = ..., total: _Optional[int] = ..., paused: _Optional[bool] = ..., paused_groups: _Optional[int] = ..., dead_letter_queue_hidden: _Optional[bool] = ...) -> None: ...

class GetQueuesRequest(_message.Message):
    __slots__ = ("type",)
    TYPE_FIELD_NUMBER: _ClassVar[int]
    type: str
    def __init__(self, type: _Optional[str] = ...) -> None: ...

class GetQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[GetQueueResponse]
    def __init__(self, queues: _Optional[_Iterable[_Union[GetQueueResponse, _Mapping]]] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("queueName", "id", "group", "priority", "content", "metadata", "dedup_key", "ttl", "delay")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DEDUP_KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    group: str
    priority: int
    content: str
    metadata: _containers.ScalarMap[str, str]
    dedup_key: str
    ttl: int
    delay: int
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ..., content: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., dedup_key: _Optional[str] = ..., ttl: _Optional[int] = ..., delay: _Optional[int] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("success", "queueName", "id", "group", "priority", "content", "metadata", "duplicate")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    queueName: str
    id: int
    group: str
    priority: int
    content: str
    metadata: _containers.ScalarMap[str, str]
    duplicate: bool
    def __init__(self, success: _Optional[bool] = ..., queueName: _Optional[str] = ..., id: _Optional[int] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ..., content: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class DequeueRequest(_message.Message):
    __slots__ = ("queueName", "ack", "credit", "max_batch", "consumer")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    ack: bool
    credit: int
    max_batch: int
    consumer: str
    def __init__(self, queueName: _Optional[str] = ..., ack: _Optional[bool] = ..., credit: _Optional[int] = ..., max_batch: _Optional[int] = ..., consumer: _Optional[str] = ...) -> None: ...

class DequeueResponse(_message.Message):
    __slots__ = ("success", "queueName", "id", "group", "priority", "content", "metadata", "messages", "deliveries", "last_error", "expires_at", "delivery")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    success: bool
    queueName: str
    id: int
    group: str
    priority: int
    content: str
    metadata: _containers.ScalarMap[str, str]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    deliveries: int
    last_error: str
    expires_at: int
    delivery: str
    def __init__(self, success: _Optional[bool] = ..., queueName: _Optional[str] = ..., id: _Optional[int] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ..., content: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., deliveries: _Optional[int] = ..., last_error: _Optional[str] = ..., expires_at: _Optional[int] = ..., delivery: _Optional[str] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("queueName", "id")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("success", "queueName", "id", "group", "priority", "content", "metadata", "deliveries", "last_error", "expires_at", "delivery")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    success: bool
    queueName: str
    id: int
    group: str
    priority: int
    content: str
    metadata: _containers.ScalarMap[str, str]
    deliveries: int
    last_error: str
    expires_at: int
    delivery: str
    def __init__(self, success: _Optional[bool] = ..., queueName: _Optional[str] = ..., id: _Optional[int] = ..., group: _Optional[str] = ..., priority: _Optional[int] = ..., content: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., deliveries: _Optional[int] = ..., last_error: _Optional[str] = ..., expires_at: _Optional[int] = ..., delivery: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("queueName", "id")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("queueName", "id", "delivery", "enqueue")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    delivery: str
    enqueue: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ..., delivery: _Optional[str] = ..., enqueue: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("success", "ids")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, success: _Optional[bool] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("queueName", "id", "priority", "metadata", "error", "delay", "delivery", "enqueue")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    priority: int
    metadata: _containers.ScalarMap[str, str]
    error: str
    delay: int
    delivery: str
    enqueue: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ..., priority: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., error: _Optional[str] = ..., delay: _Optional[int] = ..., delivery: _Optional[str] = ..., enqueue: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("success", "dead_lettered", "dead_letter_refused", "ids")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_REFUSED_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    dead_lettered: bool
    dead_letter_refused: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, success: _Optional[bool] = ..., dead_lettered: _Optional[bool] = ..., dead_letter_refused: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class UpdatePriorityRequest(_message.Message):
    __slots__ = ("queueName", "id", "priority")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    priority: int
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class UpdatePriorityResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class TouchRequest(_message.Message):
    __slots__ = ("queueName", "id", "delivery")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    delivery: str
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ..., delivery: _Optional[str] = ...) -> None: ...

class TouchResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class RaftCommand(_message.Message):
    __slots__ = ("createQueue", "updateQueue", "deleteQueue", "getQueue", "getQueues", "enqueue", "dequeue", "get", "delete", "ack", "nack", "updatePriority", "leaderConfigChange", "touch")
    CREATEQUEUE_FIELD_NUMBER: _ClassVar[int]
    UPDATEQUEUE_FIELD_NUMBER: _ClassVar[int]
    DELETEQUEUE_FIELD_NUMBER: _ClassVar[int]
    GETQUEUE_FIELD_NUMBER: _ClassVar[int]
    GETQUEUES_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_FIELD_NUMBER: _ClassVar[int]
    DEQUEUE_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    UPDATEPRIORITY_FIELD_NUMBER: _ClassVar[int]
    LEADERCONFIGCHANGE_FIELD_NUMBER: _ClassVar[int]
    TOUCH_FIELD_NUMBER: _ClassVar[int]
    createQueue: CreateQueueRequest
    updateQueue: UpdateQueueRequest
    deleteQueue: DeleteQueueRequest
    getQueue: GetQueueRequest
    getQueues: GetQueuesRequest
    enqueue: EnqueueRequest
    dequeue: DequeueRequest
    get: GetRequest
    delete: DeleteRequest
    ack: AckRequest
    nack: NackRequest
    updatePriority: UpdatePriorityRequest
    leaderConfigChange: LeaderConfigChange
    touch: TouchRequest
    def __init__(self, createQueue: _Optional[_Union[CreateQueueRequest, _Mapping]] = ..., updateQueue: _Optional[_Union[UpdateQueueRequest, _Mapping]] = ..., deleteQueue: _Optional[_Union[DeleteQueueRequest, _Mapping]] = ..., getQueue: _Optional[_Union[GetQueueRequest, _Mapping]] = ..., getQueues: _Optional[_Union[GetQueuesRequest, _Mapping]] = ..., enqueue: _Optional[_Union[EnqueueRequest, _Mapping]] = ..., dequeue: _Optional[_Union[DequeueRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., delete: _Optional[_Union[DeleteRequest, _Mapping]] = ..., ack: _Optional[_Union[AckRequest, _Mapping]] = ..., nack: _Optional[_Union[NackRequest, _Mapping]] = ..., updatePriority: _Optional[_Union[UpdatePriorityRequest, _Mapping]] = ..., leaderConfigChange: _Optional[_Union[LeaderConfigChange, _Mapping]] = ..., touch: _Optional[_Union[TouchRequest, _Mapping]] = ...) -> None: ...

class EnqueueBatchRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, messages: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class EnqueueBatchResponse(_message.Message):
    __slots__ = ("success", "ids")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, success: _Optional[bool] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AckBatchRequest(_message.Message):
    __slots__ = ("queueName", "ids", "deliveries", "enqueue")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    deliveries: _containers.RepeatedScalarFieldContainer[str]
    enqueue: _containers.RepeatedCompositeFieldContainer[SettleEnqueue]
    def __init__(self, queueName: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., deliveries: _Optional[_Iterable[str]] = ..., enqueue: _Optional[_Iterable[_Union[SettleEnqueue, _Mapping]]] = ...) -> None: ...

class SettleEnqueue(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    def __init__(self, messages: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ...) -> None: ...

class StoredIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AckBatchResponse(_message.Message):
    __slots__ = ("success", "failed_ids", "enqueued", "failures")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    FAILED_IDS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    success: bool
    failed_ids: _containers.RepeatedScalarFieldContainer[int]
    enqueued: _containers.RepeatedCompositeFieldContainer[StoredIds]
    failures: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, success: _Optional[bool] = ..., failed_ids: _Optional[_Iterable[int]] = ..., enqueued: _Optional[_Iterable[_Union[StoredIds, _Mapping]]] = ..., failures: _Optional[_Iterable[str]] = ...) -> None: ...

class RejectRequest(_message.Message):
    __slots__ = ("queueName", "id", "error", "delivery", "enqueue", "reason")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    error: str
    delivery: str
    enqueue: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    reason: str
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ..., error: _Optional[str] = ..., delivery: _Optional[str] = ..., enqueue: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...

class RejectResponse(_message.Message):
    __slots__ = ("success", "ids")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, success: _Optional[bool] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RedriveRequest(_message.Message):
    __slots__ = ("queueName", "to", "ids", "count")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    to: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    count: int
    def __init__(self, queueName: _Optional[str] = ..., to: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., count: _Optional[int] = ...) -> None: ...

class RedriveFailure(_message.Message):
    __slots__ = ("id", "code", "detail")
    ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: int
    code: str
    detail: str
    def __init__(self, id: _Optional[int] = ..., code: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RedriveResponse(_message.Message):
    __slots__ = ("success", "moved", "failed")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    success: bool
    moved: int
    failed: _containers.RepeatedCompositeFieldContainer[RedriveFailure]
    def __init__(self, success: _Optional[bool] = ..., moved: _Optional[int] = ..., failed: _Optional[_Iterable[_Union[RedriveFailure, _Mapping]]] = ...) -> None: ...

class PurgeQueueRequest(_message.Message):
    __slots__ = ("queueName", "include_unacked")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_UNACKED_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    include_unacked: bool
    def __init__(self, queueName: _Optional[str] = ..., include_unacked: _Optional[bool] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ("success", "purged")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    PURGED_FIELD_NUMBER: _ClassVar[int]
    success: bool
    purged: int
    def __init__(self, success: _Optional[bool] = ..., purged: _Optional[int] = ...) -> None: ...

class QueueControlRequest(_message.Message):
    __slots__ = ("queueName",)
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    def __init__(self, queueName: _Optional[str] = ...) -> None: ...

class GroupControlRequest(_message.Message):
    __slots__ = ("queueName", "group")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    group: str
    def __init__(self, queueName: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class ControlResponse(_message.Message):
    __slots__ = ("success", "changed")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    success: bool
    changed: bool
    def __init__(self, success: _Optional[bool] = ..., changed: _Optional[bool] = ...) -> None: ...

class GetGroupsRequest(_message.Message):
    __slots__ = ("queueName",)
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    def __init__(self, queueName: _Optional[str] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("group", "ready", "unacked", "paused", "paused_by")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    UNACKED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_BY_FIELD_NUMBER: _ClassVar[int]
    group: str
    ready: int
    unacked: int
    paused: bool
    paused_by: str
    def __init__(self, group: _Optional[str] = ..., ready: _Optional[int] = ..., unacked: _Optional[int] = ..., paused: _Optional[bool] = ..., paused_by: _Optional[str] = ...) -> None: ...

class GetGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class BrowseRequest(_message.Message):
    __slots__ = ("queueName", "state", "group", "after", "limit")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    state: str
    group: str
    after: int
    limit: int
    def __init__(self, queueName: _Optional[str] = ..., state: _Optional[str] = ..., group: _Optional[str] = ..., after: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class BrowsedMessage(_message.Message):
    __slots__ = ("message", "state", "deadline", "consumer", "delivered_at")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_AT_FIELD_NUMBER: _ClassVar[int]
    message: Message
    state: str
    deadline: int
    consumer: str
    delivered_at: int
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., state: _Optional[str] = ..., deadline: _Optional[int] = ..., consumer: _Optional[str] = ..., delivered_at: _Optional[int] = ...) -> None: ...

class BrowseResponse(_message.Message):
    __slots__ = ("messages", "next")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[BrowsedMessage]
    next: int
    def __init__(self, messages: _Optional[_Iterable[_Union[BrowsedMessage, _Mapping]]] = ..., next: _Optional[int] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("queueName", "id")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    id: int
    def __init__(self, queueName: _Optional[str] = ..., id: _Optional[int] = ...) -> None: ...

class ExplainReason(_message.Message):
    __slots__ = ("code", "group", "until", "next_at", "unacked", "max", "in_flight")
    CODE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    NEXT_AT_FIELD_NUMBER: _ClassVar[int]
    UNACKED_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    code: str
    group: str
    until: int
    next_at: int
    unacked: int
    max: int
    in_flight: int
    def __init__(self, code: _Optional[str] = ..., group: _Optional[str] = ..., until: _Optional[int] = ..., next_at: _Optional[int] = ..., unacked: _Optional[int] = ..., max: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("id", "state", "reasons", "ahead", "held_by", "held_since")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_FIELD_NUMBER: _ClassVar[int]
    HELD_SINCE_FIELD_NUMBER: _ClassVar[int]
    id: int
    state: str
    reasons: _containers.RepeatedCompositeFieldContainer[ExplainReason]
    ahead: int
    held_by: str
    held_since: int
    def __init__(self, id: _Optional[int] = ..., state: _Optional[str] = ..., reasons: _Optional[_Iterable[_Union[ExplainReason, _Mapping]]] = ..., ahead: _Optional[int] = ..., held_by: _Optional[str] = ..., held_since: _Optional[int] = ...) -> None: ...

class GetConsumersRequest(_message.Message):
    __slots__ = ("queueName",)
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    def __init__(self, queueName: _Optional[str] = ...) -> None: ...

class ConsumerInfo(_message.Message):
    __slots__ = ("name", "held", "messages", "oldest_lease_ms", "last_seen", "deliveries", "acks", "nacks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    held: int
    messages: _containers.RepeatedScalarFieldContainer[int]
    oldest_lease_ms: int
    last_seen: int
    deliveries: int
    acks: int
    nacks: int
    def __init__(self, name: _Optional[str] = ..., held: _Optional[int] = ..., messages: _Optional[_Iterable[int]] = ..., oldest_lease_ms: _Optional[int] = ..., last_seen: _Optional[int] = ..., deliveries: _Optional[int] = ..., acks: _Optional[int] = ..., nacks: _Optional[int] = ...) -> None: ...

class GetConsumersResponse(_message.Message):
    __slots__ = ("consumers",)
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerInfo]
    def __init__(self, consumers: _Optional[_Iterable[_Union[ConsumerInfo, _Mapping]]] = ...) -> None: ...

class ScheduleMessage(_message.Message):
    __slots__ = ("content", "priority", "group", "metadata", "ttl")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    content: str
    priority: int
    group: str
    metadata: _containers.ScalarMap[str, str]
    ttl: int
    def __init__(self, content: _Optional[str] = ..., priority: _Optional[int] = ..., group: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., ttl: _Optional[int] = ...) -> None: ...

class ScheduleDefinition(_message.Message):
    __slots__ = ("name", "cron", "every", "timezone", "message", "start_at", "end_at", "catch_up", "grace")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    EVERY_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    END_AT_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: str
    every: int
    timezone: str
    message: ScheduleMessage
    start_at: int
    end_at: int
    catch_up: str
    grace: int
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., every: _Optional[int] = ..., timezone: _Optional[str] = ..., message: _Optional[_Union[ScheduleMessage, _Mapping]] = ..., start_at: _Optional[int] = ..., end_at: _Optional[int] = ..., catch_up: _Optional[str] = ..., grace: _Optional[int] = ...) -> None: ...

class PutScheduleRequest(_message.Message):
    __slots__ = ("queueName", "schedule", "paused")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    schedule: ScheduleDefinition
    paused: bool
    def __init__(self, queueName: _Optional[str] = ..., schedule: _Optional[_Union[ScheduleDefinition, _Mapping]] = ..., paused: _Optional[bool] = ...) -> None: ...

class ScheduleInfo(_message.Message):
    __slots__ = ("schedule", "paused", "next_at", "last_fired", "fired", "skipped", "refused", "last_error", "created_at")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRED_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    schedule: ScheduleDefinition
    paused: bool
    next_at: int
    last_fired: int
    fired: int
    skipped: int
    refused: int
    last_error: str
    created_at: int
    def __init__(self, schedule: _Optional[_Union[ScheduleDefinition, _Mapping]] = ..., paused: _Optional[bool] = ..., next_at: _Optional[int] = ..., last_fired: _Optional[int] = ..., fired: _Optional[int] = ..., skipped: _Optional[int] = ..., refused: _Optional[int] = ..., last_error: _Optional[str] = ..., created_at: _Optional[int] = ...) -> None: ...

class PutScheduleResponse(_message.Message):
    __slots__ = ("success", "status", "schedule")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    status: str
    schedule: ScheduleInfo
    def __init__(self, success: _Optional[bool] = ..., status: _Optional[str] = ..., schedule: _Optional[_Union[ScheduleInfo, _Mapping]] = ...) -> None: ...

class GetSchedulesRequest(_message.Message):
    __slots__ = ("queueName", "name")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    name: str
    def __init__(self, queueName: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetSchedulesResponse(_message.Message):
    __slots__ = ("schedules",)
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[ScheduleInfo]
    def __init__(self, schedules: _Optional[_Iterable[_Union[ScheduleInfo, _Mapping]]] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("queueName", "name")
    QUEUENAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    queueName: str
    name: str
    def __init__(self, queueName: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...
