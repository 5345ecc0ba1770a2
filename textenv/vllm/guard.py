"""Run a server command and stop all its processes when textenv goes away (standard library only).

    python -I guard.py --parent-fd N --grace S -- python -m vllm.entrypoints.openai.api_server ...

textenv starts this script in a new session, so that it leads the server's process group, and hands it the read
end of a pipe whose write end only textenv holds. The script starts the command as its child (in the same group)
and stops the whole group, SIGTERM first and SIGKILL to what is left after `--grace` seconds, when:

- it gets SIGTERM, SIGINT or SIGHUP (textenv stopping the server, or `kill`);
- the pipe reaches end of file: textenv exited, however (SIGKILL and the OOM killer included). The kernel's
  parent-death signal (PR_SET_PDEATHSIG) is not used: it fires when the parent *thread* exits, and textenv
  starts servers from worker threads;
- the command exits by itself (its leftover helpers, such as vLLM's engine-core processes, are stopped too).

It then exits with the command's status (128 + N for a command ended by signal N).
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-fd", type=int, required=True, help="read end of textenv's lifeline pipe")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's command line")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("no command to run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="[textenv guard] %(message)s", stream=sys.stderr)  # into the server's log
    received: list[int] = []
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)  # every signal below (SIGCHLD included) wakes the select in wait_for_stop
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda signum, frame: received.append(signum))
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    child = subprocess.Popen(args.command)
    reason = wait_for_stop(child, args.parent_fd, wakeup_read, received)
    log(f"{reason}: stopping process group {os.getpgid(0)} (SIGTERM, SIGKILL after {args.grace:g} s)")
    stop_group(child, args.grace)
    status = child.wait()
    return status if status >= 0 else 128 - status


def wait_for_stop(child: subprocess.Popen, parent_fd: int, wakeup_fd: int, received: list[int]) -> str:
    """Wait until a reason to stop the group comes, and say which."""
    while True:
        if received:
            return f"got {signal.Signals(received[0]).name}"
        if child.poll() is not None:
            return f"the server exited with {child.returncode}"
        readable, _, _ = select.select([parent_fd, wakeup_fd], [], [], 5.0)
        if parent_fd in readable and not os.read(parent_fd, 1):  # textenv never writes: readable means closed
            return "textenv exited"
        if wakeup_fd in readable:
            os.read(wakeup_fd, 512)


def stop_group(child: subprocess.Popen, grace: float) -> None:
    """SIGTERM to every process of this group but this one, then SIGKILL to those left after `grace` seconds."""
    for signum in STOP_SIGNALS:  # a second signal must not interrupt the stop, nor the group's SIGTERM end it
        signal.signal(signum, signal.SIG_IGN)
    os.killpg(os.getpgid(0), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_members() and time.monotonic() < deadline:
        child.poll()  # reaps the command: a zombie child would count as a member
        time.sleep(0.1)
    for _ in range(50):  # a member may fork while it is being killed: repeat until none is left
        if not group_members():
            return
        log(f"still running after {grace:g} s: processes {group_members()}; SIGKILL")
        for pid in group_members():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        child.poll()


def group_members() -> list[int]:
    """The live processes of this process group other than this one (zombies count as gone)."""
    own_pid, pgid = os.getpid(), os.getpgid(0)
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own_pid:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields[n - 3] is field n of proc(5): state 3, pgrp 5
            members.append(int(entry))
    return members


def log(message: str) -> None:
    logging.getLogger("textenv.guard").warning(message)


if __name__ == "__main__":
    sys.exit(main())
