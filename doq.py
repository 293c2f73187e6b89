#!/usr/bin/env python3
"""DOQ: a durable, replicated work queue.

Usage:
  doq [serve] [options]
  doq backup --url=<url>... --output=<file> [--since=<n>] [--timeout=<seconds>]
             [--api-key=<key>] [--ca-file=<file>] [--cert-file=<file> --key-file=<file>]
  doq restore --url=<url>... [--full=<file>] [--incremental=<files>]...
              [--timeout=<seconds>] [--api-key=<key>] [--ca-file=<file>]
              [--cert-file=<file> --key-file=<file>]
  doq tui [--url=<url>...] [--refresh=<seconds>] [--api-key=<key>] [--ca-file=<file>]
          [--cert-file=<file> --key-file=<file>]
  doq keys add --name=<name> --role=<role> [--queues=<patterns>] [--keys-file=<file>]
  doq keys list [--keys-file=<file>]
  doq keys revoke --name=<name> [--keys-file=<file>]
  doq certs --out=<dir> [--hosts=<names>] [--days=<n>]
  doq secret [--file=<file>]
  doq get queues [options]
  doq get messages [--queue=<name>] [--output=<value>] [options] [<id>...]
  doq worker <app> --queues=<patterns> [--concurrency=<n>] [--grace=<seconds>]
             [--metrics=<address>] [--pool=<kind>] [--prefetch=<n>]
  doq (-h | --help)
  doq --version

Commands:
  serve         Run a server node (also what runs when no command is given).
  backup        Write a backup, streamed from the cluster's leader, to a file; prints
                the --since of the next incremental backup.
  restore       Restore a full backup and/or incremental ones, in the order given,
                through the cluster's leader: all or nothing, on every replica.
  tui           The terminal console: queues, messages and the cluster, by keys
                (? lists them). Default --url http://localhost:8000.
  keys          Manage the API keys file (auth.keys_file): add prints the new key
                once (only its SHA-256 is stored), list shows names, roles and
                queue patterns, revoke removes one. Running nodes pick changes up
                within a second or two.
  certs         Make a throwaway CA and certificates for trying TLS on a local
                cluster: ca.pem, node.pem / node-key.pem (for localhost, 127.0.0.1,
                ::1 and --hosts; server and client use) and client.pem /
                client-key.pem, written to --out.
  secret        A new cluster secret (raft.password_file): 64 random hex digits,
                printed, or written to a new --file that only you can read.
  get queues    Offline (the node stopped): list the queues of the local store.
  get messages  Offline: messages of --queue, by id or from --last-id on.
  worker        Run the tasks of <app> (module:attribute, a doq_lib.tasks.App) from
                the queues given, on that many threads; SIGTERM or SIGINT stops
                taking, lets running tasks finish within the grace, and gives back
                the rest.

Options:
  -h --help                 Show this help and exit.
  --version                 Show the version and exit.
  --config=<path>           serve, get: the configuration file, YAML or JSON.
                            Without it, the first of config.yaml, config.yml and
                            config.json in the working directory is read, if present.
  --url=<url>               HTTP address of a node (repeat for several); the leader
                            is found from any of them.
  -o <value> --output=<value>
                            backup: the file to write. get messages: the format,
                            text, json (the original's keys) or jsonl (one message
                            a line, the API's keys); default text.
  --since=<n>               backup: 0 for a full backup, else the version to start
                            from (the number the previous backup printed); default 0
  -f <file> --full=<file>   restore: the full backup.
  -i <files> --incremental=<files>
                            restore: incremental backups, in order (repeat the option
                            or separate with commas).
  --timeout=<seconds>       backup, restore: give up after this long; default 3600
  --refresh=<seconds>       tui: seconds between refreshes; default 2
  --api-key=<key>           backup, restore, tui: the API key to send (default: the
                            environment variable DOQ_API_KEY).
  --ca-file=<file>          backup, restore, tui: the CA certificate(s) that sign the
                            nodes' certificates, for https:// URLs (default: the
                            system's).
  --cert-file=<file>        backup, restore, tui: a client certificate (PEM), for
                            nodes that require one (mutual TLS).
  --key-file=<file>         backup, restore, tui: the private key of --cert-file.
  --keys-file=<file>        keys: the keys file (default: the auth.keys_file of the
                            configuration).
  --name=<name>             keys: the key's name (letters, digits, ._@-).
  --role=<role>             keys add: admin, producer, consumer or reader.
  --queues=<patterns>       keys add: comma-separated queue name patterns (* ? [..])
                            the key is limited to; default: every queue. worker: the
                            queues to take tasks from, comma-separated.
  --concurrency=<n>         worker: tasks run at once (threads, processes); default 8
  --prefetch=<n>            worker: messages each queue's consumer keeps taken (their
                            leases kept); default 4 per --concurrency, at most 1000
  --grace=<seconds>         worker: how long running tasks may finish after a stop
                            signal; default 30
  --metrics=<address>       worker: serve Prometheus metrics on this host:port
  --pool=<kind>             worker: threads (default), asyncio (async def tasks
                            awaited on one event loop, interrupted at their timeout)
                            or processes (each run in a child process, which its
                            timeout ends)
  --out=<dir>               certs: the directory to write to (created if missing).
  --hosts=<names>           certs: comma-separated further host names and addresses
                            of the nodes.
  --days=<n>                certs: days the certificates are valid; default 30
  --file=<file>             secret: the file to create (mode 0600; an existing file
                            is left as it is and refused).
  -q <name> --queue=<name>  get messages: the queue.
  -n <n> --limit=<n>        get messages: at most this many; default 10
  -l <id> --last-id=<id>    get messages: only ids above this one; default 0

Exit codes: 0 done; 1 refused or failed; 2 usage or configuration error;
3 no node reachable, or no leader.

Every configuration key below is a flag. It can also be set in the environment,
as the key upper-cased with its dots kept (HTTP.PORT) or, for shells, as DOQ_ and
the key upper-cased with dots turned into underscores (DOQ_HTTP_PORT); and in the
config file, nested by the dots (http: {port: 8000}). Precedence: flag, then
environment, then config file, then the default.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from docopt import DocoptExit, docopt

from doq_lib import usage as cli_usage
from doq_lib.config import IGNORED, KEY_DOCS, KEYS, Config, ConfigError, load_config

__version__ = "0.1.0"

EXIT_USAGE = 2
DEFAULT_COMMAND = "serve"
_METAVARS: Mapping[type, str] = {
    bool: "bool", int: "int", float: "float", str: "text", tuple: "list",
}

Args = Mapping[str, Any]


def _show(value: object) -> str:
    """A default as a user would type it; empty for empty strings and lists."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def config_options_help(shown: bool = False) -> str:
    """One docopt option line per configuration key, generated from doq_lib.config.

    Defaults are shown as "; default: ...", never as docopt's bracketed default
    syntax: flags not given must stay None so that environment and file apply.
    ``shown``: the text a user reads, without the keys accepted only for compatibility
    (docopt must know them all).
    """
    defaults = Config()
    flags = {key: f"--{key}=<{_METAVARS[spec.type]}>" for key, spec in KEYS.items()
             if not (shown and IGNORED in KEY_DOCS[key])}
    width = max(map(len, flags.values())) + 2
    lines = ["Configuration options:"]
    for key, flag in flags.items():
        default = _show(defaults.value(key))
        suffix = f"; default: {default}" if default else ""
        lines.append(f"  {flag:<{width}}{KEY_DOCS[key]}{suffix}")
    if shown:
        hidden = sum(IGNORED in KEY_DOCS[key] for key in KEYS)
        lines.append(f"  ({hidden} more keys of the original's configuration are accepted "
                     "for compatibility and ignored; docs/configuration.md lists them.)")
    return "\n".join(lines) + "\n"


def usage() -> str:
    """The complete docopt text: the module docstring and the configuration flags."""
    return f"{__doc__}\n{config_options_help()}"


def help_text(argv: list[str]) -> str:
    """``--help``: the commands, or with a command the help of that command (``serve``'s
    with every configuration flag)."""
    doc = cli_usage.parse(__doc__ or "")
    command = cli_usage.command_of(argv, _takes_value())
    if command in doc.commands:
        return cli_usage.command_help(doc, command, _configuration_help())
    return _overview()


def _overview() -> str:
    """``doq --help``: the usage, the commands and the exit codes; options are each
    command's help."""
    text = __doc__ or ""
    head, _, rest = text.partition("\nOptions:\n")
    exits = rest[rest.index("Exit codes:"):rest.index("\n\n", rest.index("Exit codes:"))]
    return (f"{head}\n{exits}\n\n"
            "A command's options: doq <command> --help. The server's configuration flags\n"
            "(also environment variables and the config file): doq serve --help.\n")


def _configuration_help() -> str:
    text = __doc__ or ""
    about = text[text.index("Every configuration key below"):].rstrip()
    return f"{about}\n\n{config_options_help(shown=True)}"


def _options() -> tuple[set[str], set[str]]:
    """Every option the command line knows, and those that take a value."""
    doc = cli_usage.parse(__doc__ or "")
    known = {name for opt in doc.options for name in opt.names}
    valued = {name for opt in doc.options if opt.takes_value for name in opt.names}
    flags = {f"--{key}" for key in KEYS} | {"--config"}
    return known | flags, valued | flags


def _takes_value() -> set[str]:
    return _options()[1]


def parse_args(argv: list[str] | None) -> Args:
    """Parse the command line (None = sys.argv[1:]); docopt exits on --version. A line that
    does not fit the usage raises DocoptExit (see :func:`main`)."""
    return docopt(usage(), argv, default_help=False, version=f"doq {__version__}")


def config_flags(args: Args) -> dict[str, str]:
    """The configuration flags explicitly given, by dotted key."""
    given = {key: args.get(f"--{key}") for key in KEYS}
    return {key: value for key, value in given.items() if isinstance(value, str)}


def config_from_args(args: Args, env: Mapping[str, str], cwd: str) -> Config:
    """Load the configuration for parsed ``args``; raises ConfigError."""
    return load_config(config_flags(args), env, args.get("--config"), cwd)


def parse_serve(argv: list[str], env: Mapping[str, str], cwd: str) -> Config:
    """What ``doq.py serve`` would run with, without starting anything (for tests)."""
    return config_from_args(parse_args(argv), env, cwd)


def _say(message: str) -> None:
    print(f"doq: {message}", file=sys.stderr)


def _start_server(cfg: Config) -> int:
    """Patch gevent first, then import the server."""
    from gevent import monkey

    monkey.patch_all()
    from doq_lib.server import run_server

    return run_server(cfg)


def checked_config(args: Args, env: Mapping[str, str], cwd: str) -> Config | None:
    """The configuration, with problems and warnings printed; None if unusable."""
    try:
        cfg = config_from_args(args, env, cwd)
    except ConfigError as exc:
        for problem in exc.problems:
            _say(problem)
        return None
    for warning in cfg.warnings:
        _say(f"warning: {warning}")
    return cfg


def run_serve(args: Args) -> int:
    """``doq.py serve``: load and check the configuration, then run the node."""
    cfg = checked_config(args, os.environ, os.getcwd())
    return EXIT_USAGE if cfg is None else _start_server(cfg)


#: Defaults of the tool flags, applied here: docopt defaults would also fill the
#: configuration flags' slots, which must stay None when not given.
TOOL_DEFAULTS = {"--since": "0", "--timeout": "3600", "--limit": "10", "--last-id": "0",
                 "--refresh": "2", "--days": "30", "--concurrency": "8", "--grace": "30"}


def _number(args: Args, flag: str) -> int | None:
    value = args.get(flag) or TOOL_DEFAULTS[flag]
    try:
        return int(value)
    except (TypeError, ValueError):
        _say(f"{flag} expects a whole number, not {value!r}")
        return None


def client_security(args: Args, env: Mapping[str, str]) -> Any:
    """The API key (flag, else DOQ_API_KEY) and TLS files a client command uses."""
    from doq_lib.client import Security

    return Security(api_key=args.get("--api-key") or env.get("DOQ_API_KEY") or None,
                    ca_file=args.get("--ca-file") or None,
                    cert_file=args.get("--cert-file") or None,
                    key_file=args.get("--key-file") or None)


def run_backup(args: Args) -> int:
    from doq_lib import admin

    since, timeout = _number(args, "--since"), _number(args, "--timeout")
    if since is None or timeout is None:
        return EXIT_USAGE
    return admin.run_backup(args["--url"], args["--output"], since, timeout,
                            security=client_security(args, os.environ))


def run_restore(args: Args) -> int:
    from doq_lib import admin

    timeout = _number(args, "--timeout")
    if timeout is None:
        return EXIT_USAGE
    return admin.run_restore(args["--url"], args["--full"], args["--incremental"], timeout,
                             security=client_security(args, os.environ))


def run_tui(args: Args) -> int:
    refresh = _number(args, "--refresh")
    if refresh is None or refresh < 1:
        _say("--refresh expects a whole number of seconds, at least 1")
        return EXIT_USAGE
    from tui.app import run

    return run(args["--url"] or ["http://localhost:8000"], float(refresh),
               client_security(args, os.environ))


def run_keys(args: Args) -> int:
    from doq_lib import admin

    path = args.get("--keys-file")
    if not path:
        cfg = checked_config(args, os.environ, os.getcwd())
        if cfg is None:
            return EXIT_USAGE
        path = cfg.auth.keys_file
    if not path:
        _say("give --keys-file (or configure auth.keys_file)")
        return EXIT_USAGE
    if args["add"]:
        queues = [q.strip() for q in (args.get("--queues") or "").split(",") if q.strip()]
        return admin.keys_add(path, args["--name"], args["--role"], queues)
    if args["list"]:
        return admin.keys_list(path)
    return admin.keys_revoke(path, args["--name"])


def run_get(args: Args) -> int:
    from doq_lib import admin

    cfg = checked_config(args, os.environ, os.getcwd())
    if cfg is None:
        return EXIT_USAGE
    if args["queues"]:
        return admin.get_queues(cfg)
    limit, last_id = _number(args, "--limit"), _number(args, "--last-id")
    if limit is None or last_id is None:
        return EXIT_USAGE
    return admin.get_messages(cfg, args["--queue"], limit, last_id,
                              args["--output"] or "text", args["<id>"])


def run_worker(args: Args) -> int:
    from doq_lib import worker

    concurrency, grace = _number(args, "--concurrency"), _number(args, "--grace")
    if concurrency is None or grace is None:
        return EXIT_USAGE
    queues = [q.strip() for q in (args.get("--queues") or "").split(",") if q.strip()]
    sys.path.insert(0, os.getcwd())           # the app's module, as `python -m` would find it
    prefetch = None
    if args.get("--prefetch"):
        prefetch = _number(args, "--prefetch")
        if prefetch is None:
            return EXIT_USAGE
    return worker.main(args["<app>"], queues, concurrency, float(grace),
                       args.get("--metrics") or "", args.get("--pool") or "threads", prefetch)


def run_certs(args: Args) -> int:
    from doq_lib.certs import make_certificates

    days = _number(args, "--days")
    if days is None or days < 1:
        _say("--days expects a whole number, at least 1")
        return EXIT_USAGE
    hosts = [h.strip() for h in (args.get("--hosts") or "").split(",") if h.strip()]
    try:
        written = make_certificates(args["--out"], {"node": hosts}, days)
    except OSError as exc:
        _say(f"{args['--out']}: {exc.strerror or exc}")
        return 1
    for path in written:
        print(path)
    _say("for trying TLS out only: keep ca-key.pem away from the nodes")
    return 0


def run_secret(args: Args) -> int:
    import secrets

    value = secrets.token_hex(32) + "\n"
    path = args.get("--file")
    if not path:
        sys.stdout.write(value)
        return 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        _say(f"{path}: {exc.strerror or exc}" + (" (a secret is never overwritten: remove "
                                                  "it first)" if os.path.exists(path) else ""))
        return 1
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(value)
    _say(f"wrote a new cluster secret to {path}")
    return 0


#: Command name -> handler. A handler gets the parsed arguments and returns the exit
#: code. Only ``serve`` may patch gevent (Textual and offline tools hang under it).
COMMANDS: Mapping[str, Callable[[Args], int]] = {
    "serve": run_serve, "backup": run_backup, "restore": run_restore, "get": run_get,
    "tui": run_tui, "keys": run_keys, "certs": run_certs, "worker": run_worker,
    "secret": run_secret,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for usage and configuration errors)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        print(help_text(argv), end="")
        return 0
    try:
        args = parse_args(argv)
    except DocoptExit:
        known, valued = _options()
        print(cli_usage.usage_error(cli_usage.parse(__doc__ or ""), argv, known, valued),
              file=sys.stderr)
        return EXIT_USAGE
    command = next((name for name in COMMANDS if args.get(name)), DEFAULT_COMMAND)
    return COMMANDS[command](args)


if __name__ == "__main__":
    sys.exit(main())
