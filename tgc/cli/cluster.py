"""The command line's cluster parts: the `--cluster ADDRESS` option of `beam`, `compile` and `run` (a Ray cluster's
workers compile and time BEAM's candidates and compile the program's kernels: `tgc.backends.cluster`), and
`tgc worker`, which joins a Ray cluster as a node serving this machine's device.

Without Ray installed, `--cluster` and `tgc worker` are one error naming the extra (exit 1); an address other than
`local` without a token is a user error (exit 2)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import click

from tgc.errors import TgcError


def cluster_option(f: Callable) -> Callable:
    """`--cluster ADDRESS` (else `$TGC_CLUSTER`): run the command with a cluster session as BEAM's evaluator and
    the compiles' pool (`tgc.codegen.search.use_evaluator`)."""

    @functools.wraps(f)
    def wrapper(*args: Any, cluster: str | None = None, **kw: Any) -> Any:
        if not cluster:
            return f(*args, **kw)
        from tgc.backends.cluster import ClusterSession, read_token
        from tgc.codegen.search import use_evaluator

        with ClusterSession(cluster, None if cluster == "local" else read_token()) as session, \
                use_evaluator(session):
            return f(*args, **kw)

    return click.option("--cluster", metavar="ADDRESS", envvar="TGC_CLUSTER", show_envvar=True,
                        help="Compile (and BEAM-time) on the tgc workers of this Ray cluster ('local': a Ray "
                             "instance on this machine); the token from $TGC_CLUSTER_TOKEN(_FILE).")(wrapper)


@click.command("worker")
@click.option("--address", metavar="ADDR", help="The Ray cluster to join (its head's host:port).")
@click.option("--head", is_flag=True, help="Start a new cluster's head node here (which serves as a worker too).")
@click.option("--port", type=click.IntRange(1, 65535), help="With --head: the port to listen on (Ray's default 6379).")
@click.option("--token", metavar="TOKEN", help="The cluster's token (else --token-file, $TGC_CLUSTER_TOKEN or "
                                                "$TGC_CLUSTER_TOKEN_FILE).")
@click.option("--token-file", metavar="F", help="A file holding the cluster's token.")
@click.option("-d", "--device", metavar="DEV", envvar="TGC_DEVICE", show_envvar=True,
              help="The device this node serves (default CPU).")
@click.option("--num-cpus", type=click.IntRange(min=1), metavar="N", help="Cores the compiles may use (default all).")
@click.option("--dry-run", is_flag=True, help="Print the `ray start` command line (without the token) and exit.")
def worker(address: str | None, head: bool, port: int | None, token: str | None, token_file: str | None,
           device: str | None, num_cpus: int | None, dry_run: bool) -> None:
    """Join a Ray cluster as a node that compiles and times kernels for tgc clients (until Ctrl-C).

    The node declares its device (kind; for the CPU its model and core count) as a Ray resource, so that clients
    of the same device kind and token send it work. It compiles and runs the kernels clients send: start it
    only in a cluster whose clients you trust (see the README's "Tuning on a cluster")."""
    from tgc.backends import get_device
    from tgc.backends.cluster import TOKEN_ENV, ray_auth_env, ray_module, read_token, worker_command

    ray_module()
    if head == bool(address):
        raise click.UsageError("give either --address ADDR (join a cluster) or --head (start one)")
    secret = read_token(token, token_file)
    if not secret:
        raise TgcError("tgc worker needs the cluster's token",
                       hint=f"pass --token-file FILE (or set {TOKEN_ENV}); clients send the same token")
    dev = get_device(device or "CPU")
    if dev.compiler is None:
        raise TgcError(f"{dev.kind} cannot compile on this machine: {dev.compile_error or 'no compiler'}",
                       kind="runtime")
    cmd = worker_command(dev, secret, address, head, port, num_cpus)
    if dry_run:
        click.echo(" ".join(cmd))
        return
    # the node's task processes check clients' proofs against the token; Ray's own connections need the token
    # derived from it (`ray_auth_env`)
    import signal
    import subprocess

    env = {**ray_auth_env(secret), **os.environ, TOKEN_ENV: secret}
    proc = subprocess.Popen(cmd, env=env)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the node stops with this command (`ray start` ends its own)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait()
        rc = 0
    finally:
        signal.signal(signal.SIGTERM, old)
    if rc:
        raise TgcError(f"ray start failed (exit {rc})", kind="runtime")
