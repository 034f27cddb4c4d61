"""A real two-node launch on this machine: two "nodes" that are this host under two names, one rank
each, started by workflows/train_multinode.sh (the DeepSpeed launcher) through pdsh and an sshd on
127.0.0.1 with a throwaway key, and with --no_ssh and a node rank per node. gloo on CPU. Each
way: an uninterrupted run, and a run killed on one node (SIGKILL) after a checkpoint, resumed,
must log exactly the same losses."""
from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import free_port, wait_for_port
from test_trainer import LAUNCH_ENV, ROOT, write_config

from pretrain.checkpoint import LATEST
from pretrain.metrics import read_metrics

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "workflows" / "train_multinode.sh"
HOSTS = ("localhost", "127.0.0.1")
SSH_OPTIONS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o LogLevel=ERROR"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> Iterator[tuple[int, Path]]:
    """An sshd on 127.0.0.1 that takes a key made here: (port, the client's private key)."""
    daemon, pdsh = Path("/usr/sbin/sshd"), shutil.which("pdsh")
    if not daemon.is_file() or not pdsh or not shutil.which("ssh-keygen"):
        pytest.skip("sshd, ssh-keygen or pdsh not installed (Debian: openssh-server, pdsh; workflows/setup.sh installs them as root)")
    folder = tmp_path_factory.mktemp("sshd")
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "client.pub").read_text())
    port = free_port()
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host'}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPasswordAuthentication no\nPubkeyAuthentication yes\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen([str(daemon), "-D", "-e", "-f", str(folder / "sshd_config")], stderr=subprocess.PIPE)
    try:
        wait_for_port(port, "sshd", timeout=20)
        yield port, folder / "client"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def launch_env(ssh: tuple[int, Path], run: Path, fault: str | None, **extra: str) -> dict[str, str]:
    port, key = ssh
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV and k != "PRETRAIN_FAULT"}
    env_file = run / "ds_env"  # what every rank gets, on every node (DeepSpeed's .deepspeed_env)
    env_file.write_text("OMP_NUM_THREADS=1\n" + (f"PRETRAIN_FAULT={fault}\n" if fault else ""))
    env.update(DEEPSPEED=str(Path(sys.executable).with_name("deepspeed")), DS_ENV_FILE=str(env_file),
               MASTER_ADDR="127.0.0.1", SSH_PORT=str(port), NO_SSH_CHECK="1", OMP_NUM_THREADS="1",
               PDSH_SSH_ARGS_APPEND=f"-i {key} {SSH_OPTIONS}", **extra)
    return env


def start(how: str, config: Path, hostfile: Path, ssh: tuple[int, Path], fault: str | None,
          master_port: str, *args: str) -> list[subprocess.Popen]:
    """The launch: one launcher reaching both nodes through pdsh/ssh, or one launcher per node."""
    ranks = [None] if how == "pdsh" else [0, 1]
    procs = []
    for node in ranks:
        extra = {"MASTER_PORT": master_port, **({"NODE_RANK": str(node)} if node is not None else {})}
        procs.append(subprocess.Popen(["bash", str(SCRIPT), str(hostfile), str(config), *args], cwd=ROOT,
                                      env=launch_env(ssh, config.parent, fault, **extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    return procs


def finish(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]


def run_processes(config: Path) -> dict[int, int | None]:
    """{pid: rank} of every process of the run of ``config``: launchers (rank None: the local one and the
    ones sshd started) and training processes."""
    found: dict[int, int | None] = {}
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if str(config).encode() in cmdline and entry.name.isdigit():
            found[int(entry.name)] = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)
    return found


def wait_for(procs: list[subprocess.Popen], text: str, count: int, timeout: float = 600) -> None:
    """Read the launchers' output until ``count`` lines hold ``text``."""
    lines: queue.Queue[str] = queue.Queue()
    for proc in procs:
        threading.Thread(target=lambda p=proc: [lines.put(line) for line in p.stdout], daemon=True).start()
    seen, output, deadline = 0, [], time.monotonic() + timeout
    while seen < count:
        try:
            output.append(lines.get(timeout=5))
        except queue.Empty:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "".join(output[-40:])
            continue
        seen += text in output[-1]


def kill_one_node_at(procs: list[subprocess.Popen], config: Path, point: str) -> None:
    """When both ranks stand at the fault point, SIGKILL rank 1 (node 127.0.0.1), then the rest of the job."""
    wait_for(procs, f"fault point {point}", 2)
    [rank1] = [pid for pid, rank in run_processes(config).items() if rank == 1]
    os.kill(rank1, signal.SIGKILL)
    time.sleep(1)
    for pid in run_processes(config):
        os.kill(pid, signal.SIGKILL)
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("how", ["pdsh", "no_ssh"])
def test_two_nodes_train_checkpoint_die_and_resume_exactly(how, sshd, tmp_path, sample_tokenizer, sample_tokens):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in HOSTS))
    extra = {"steps": 6, "global_batch_size": 8, "deepspeed": str(ROOT / "configs/deepspeed/zero2.json"),
             "intervals": {"checkpoint": 2, "keep": 3}, "loader": {"languages": ["de", "en"]}}
    straight = write_config(tmp_path / "a" / "run.yaml", sample_tokenizer, sample_tokens, **extra)
    resumed = write_config(tmp_path / "b" / "run.yaml", sample_tokenizer, sample_tokens, **extra)
    finish(start(how, straight, hostfile, sshd, None, str(free_port())))
    kill_one_node_at(start(how, resumed, hostfile, sshd, "after_save@4", str(free_port())), resumed, "after_save step 4")
    checkpoints = tmp_path / "b" / "run" / "checkpoints"
    assert (checkpoints / LATEST).read_text() == "step-4"
    assert len(list((checkpoints / "step-4").glob("*optim_states.pt"))) == 2  # ZeRO-2: a shard from each node
    finish(start(how, resumed, hostfile, sshd, None, str(free_port()), "--resume"))
    a = read_metrics(tmp_path / "a" / "run" / "metrics.jsonl")
    b = read_metrics(tmp_path / "b" / "run" / "metrics.jsonl")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in range(1, 7):
        assert (b[step]["loss"], b[step]["grad_norm"], b[step]["lr"]) == (a[step]["loss"], a[step]["grad_norm"], a[step]["lr"])
