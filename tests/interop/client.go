// A gRPC client on grpc-go, the other HTTP/2 implementation DOQ is tried with
// (tests/interop/test_grpc_go.py builds and runs it). Every step uses one ClientConn, so one
// HTTP/2 connection: a round trip, a bidirectional stream of 1,000 messages, a stream
// cancelled midway, streams ended by the node for a message over its size limit, and then a
// call on the same connection, which must still be answered. It prints one line per step and
// exits 1 on the first failure.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "doq.local/pb"
)

func fail(format string, args ...interface{}) {
	fmt.Printf("FAIL "+format+"\n", args...)
	os.Exit(1)
}

func within(seconds int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
}

func main() {
	if len(os.Args) != 4 {
		fail("usage: client ADDRESS QUEUE OVERSIZED")
	}
	address, queue := os.Args[1], os.Args[2]
	var oversized int
	fmt.Sscan(os.Args[3], &oversized)
	conn, err := grpc.Dial(address, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithTimeout(10*time.Second))
	if err != nil {
		fail("dial: %v", err)
	}
	defer conn.Close()
	doq := pb.NewDOQClient(conn)

	// 1. a round trip
	ctx, cancel := within(10)
	created, err := doq.CreateQueue(ctx, &pb.CreateQueueRequest{Name: queue, Type: "delayed",
		Settings: &pb.QueueSettings{AckTimeout: 600}})
	cancel()
	if err != nil || !created.Success {
		fail("create queue: %v", err)
	}
	ctx, cancel = within(10)
	sent, err := doq.Enqueue(ctx, &pb.EnqueueRequest{QueueName: queue, Content: "first"})
	cancel()
	if err != nil || !sent.Success {
		fail("enqueue: %v", err)
	}
	ctx, cancel = within(10)
	got, err := doq.Dequeue(ctx, &pb.DequeueRequest{QueueName: queue, Ack: true})
	cancel()
	if err != nil || got.Content != "first" || got.Id != sent.Id {
		fail("dequeue: %v %v", got, err)
	}
	fmt.Println("ok round trip")

	// 2. a bidirectional stream of 1,000 messages, answered in order
	ctx, cancel = within(60)
	stream, err := doq.EnqueueStream(ctx)
	if err != nil {
		fail("enqueue stream: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 1000; i++ {
			msg := &pb.EnqueueRequest{QueueName: queue, Content: fmt.Sprintf("m%d", i)}
			if err := stream.Send(msg); err != nil {
				done <- err
				return
			}
		}
		done <- stream.CloseSend()
	}()
	var last uint64
	for i := 0; i < 1000; i++ {
		answer, err := stream.Recv()
		if err != nil || !answer.Success || answer.Content != fmt.Sprintf("m%d", i) ||
			answer.Id <= last {
			fail("stream answer %d: %v %v", i, answer, err)
		}
		last = answer.Id
	}
	if err := <-done; err != nil {
		fail("stream send: %v", err)
	}
	if _, err := stream.Recv(); err == nil {
		fail("stream: an answer past the last")
	}
	cancel()
	fmt.Println("ok stream of 1000")

	// 3. a stream cancelled midway, with requests still coming
	ctx, cancel = within(30)
	stream, err = doq.EnqueueStream(ctx)
	if err != nil {
		fail("cancelled stream: %v", err)
	}
	for i := 0; i < 50; i++ {
		stream.Send(&pb.EnqueueRequest{QueueName: queue, Content: strings.Repeat("c", 4000)})
	}
	if _, err := stream.Recv(); err != nil {
		fail("cancelled stream: first answer: %v", err)
	}
	cancel()
	for i := 0; ; i++ { // answers that had arrived, then the end
		if _, err := stream.Recv(); err != nil {
			if status.Code(err) != codes.Canceled {
				fail("cancelled stream: %v", err)
			}
			break
		}
		if i >= 50 {
			fail("cancelled stream: answers past the requests")
		}
	}
	fmt.Println("ok cancel")

	// 4. streams the node ends for a message over its size limit (1 MiB)
	big := strings.Repeat("o", 1<<20+1)
	for i := 0; i < oversized; i++ {
		ctx, cancel = within(20)
		stream, err = doq.EnqueueStream(ctx)
		if err != nil {
			fail("oversized %d: %v", i, err)
		}
		stream.Send(&pb.EnqueueRequest{QueueName: queue, Content: big})
		_, err = stream.Recv()
		cancel()
		if status.Code(err) != codes.ResourceExhausted {
			fail("oversized %d: %v", i, err)
		}
	}
	fmt.Printf("ok %d oversized\n", oversized)

	// 5. the same connection still carries a call
	ctx, cancel = within(10)
	queues, err := doq.GetQueues(ctx, &pb.GetQueuesRequest{})
	cancel()
	if err != nil || len(queues.Queues) == 0 {
		fail("a call after the rest: %v", err)
	}
	fmt.Println("ok call after")
}
