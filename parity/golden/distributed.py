"""Ranks under torchrun, and the shard files that make a long run resumable.

`torchrun --nproc-per-node N -m parity golden|check ...` starts N copies of the CLI; each calls
`start()`, which joins them in one process group (NCCL on GPUs, each rank on cuda:LOCAL_RANK; gloo
on CPUs). Without torchrun `start()` returns a group of one and no collective is ever called.

The work is split by batch, never by image: batch k (images k*bs .. k*bs+bs-1, the batches of one
process) goes to rank k % N, because the encoder's numerics can depend on which images share a
batch. Ranks walk the batches in rounds (round r: batches r*N .. r*N+N-1, one per rank) and after
every round exchange what they finished and whether they failed: rank 0 collects every record, and
a failure on any rank stops every rank at the same round boundary (no rank waits on a dead peer).

A WorkFolder keeps each rank's finished batches as checksummed records in its own shard file,
flushed and fsynced one by one, so a run killed at any moment (one rank or all) restarts from the
batches already on disk. The folder is keyed by the run's identity: another identity starts over.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import struct
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

# Longer than the slowest first batch (max-autotune compiles of vit_h take minutes), which every
# other rank may wait through at the first round boundary.
DEFAULT_TIMEOUT_S = 1800
# Test hook: "RANK:K" makes that rank SIGKILL itself after appending its K-th batch of this run,
# as an out-of-memory killer or a lost node would, to show that a re-run resumes.
KILL_AFTER_ENV = "PARITY_KILL_AFTER"


@dataclass(frozen=True)
class Ranks:
    """This process's place among the processes sharing a run (one process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj) -> list:
        """Every rank's obj, in rank order (pickled by torch.distributed in transit, never stored)."""
        if self.world_size == 1:
            return [obj]
        gathered = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, obj)
        except RuntimeError as err:  # gloo: connection closed by a dead peer; any backend: the timeout
            raise RankFailure(
                f"rank {self.rank} of {self.world_size} lost the other ranks at a batch boundary "
                f"({type(err).__name__}: {err}); one was killed or did not answer within --collective-timeout",
                bad_input=False, agreed=False) from err
        return gathered

    def from_main(self, obj):
        """Rank 0's obj, on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


SINGLE_PROCESS = Ranks()


def start(device: str | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[Ranks, torch.device]:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK),
    and pick this rank's device: cuda:LOCAL_RANK with NCCL on GPUs, the CPU with gloo."""
    wanted = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return SINGLE_PROCESS, wanted
    if wanted.type == "cuda":
        wanted = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(wanted)
    dist.init_process_group("nccl" if wanted.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s),
                            device_id=wanted if wanted.type == "cuda" else None)
    return Ranks(dist.get_rank(), world_size), wanted


def stop(ranks: Ranks) -> None:
    if ranks.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


class RankFailure(RuntimeError):
    """A rank could not finish its batch; raised on every rank, with the failing rank's words.

    bad_input: the data was at fault (an unreadable image): exit 2 rather than a failed stage's 1.
    agreed: every rank raised this same message (so rank 0 alone need say it), rather than this
    rank alone finding its peers gone.
    """

    def __init__(self, message: str, bad_input: bool, agreed: bool = True):
        super().__init__(message)
        self.bad_input, self.agreed = bad_input, agreed


def failure(ranks: Ranks, what: str, bad_input: bool) -> dict:
    """What a failing rank tells the others (plain data, so it crosses any backend): `what` names
    the images and the error."""
    where = f"rank {ranks.rank} of {ranks.world_size} " if ranks.world_size > 1 else ""
    return {"message": f"{where}failed on {what}", "bad_input": bad_input}


def raise_first_failure(failures: list[dict | None]) -> None:
    """Stop every rank alike when any rank failed (the lowest failing rank speaks for the run)."""
    for entry in failures:
        if entry:
            raise RankFailure(entry["message"], entry["bad_input"])


def kill_if_asked(ranks: Ranks, appended: int) -> None:
    wanted = os.environ.get(KILL_AFTER_ENV)
    if wanted and wanted == f"{ranks.rank}:{appended}":
        os.kill(os.getpid(), signal.SIGKILL)


# A record: magic, payload length, sha256 of the payload, payload. A reader stops at the first
# record that is short or fails its checksum: the torn tail of a rank killed mid-write.
_MAGIC = b"PSR1"
_HEADER = struct.Struct("<4sQ32s")


def encode_record(payload: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def read_records(path: Path) -> tuple[list[bytes], int]:
    """The whole records at the start of a shard file, and the byte offset where they end."""
    data = path.read_bytes() if path.exists() else b""
    records, offset = [], 0
    while offset + _HEADER.size <= len(data):
        magic, length, digest = _HEADER.unpack_from(data, offset)
        payload = data[offset + _HEADER.size : offset + _HEADER.size + length]
        if magic != _MAGIC or len(payload) != length or hashlib.sha256(payload).digest() != digest:
            break
        records.append(payload)
        offset += _HEADER.size + length
    return records, offset


class WorkFolder:
    """Finished batches of one run on disk: identity.json plus one shard file per rank.

    Payloads are bytes whose first line is a JSON header holding the batch index (see
    parity.tasks.point.produce.BatchOutputs); this class reads only that index.
    """

    def __init__(self, path: Path, identity: dict, ranks: Ranks):
        self.path, self.identity, self.ranks = Path(path), identity, ranks
        self.appended = 0

    def open(self) -> dict[int, bytes]:
        """Start or resume: the payloads already finished by any rank of an earlier run, by batch.

        Rank 0 clears a folder left by another identity (saying so); the others wait for it.
        """
        identity_file = self.path / "identity.json"
        if self.ranks.is_main:
            if identity_file.exists() and json.loads(identity_file.read_text()) != self.identity:
                print(f"{self.path} holds batches of another run (other model, data, stage or settings): starting over")
                shutil.rmtree(self.path)
            if not identity_file.exists():
                self.path.mkdir(parents=True, exist_ok=True)
                _write_synced(identity_file, json.dumps(self.identity, indent=2, sort_keys=True).encode())
        self.ranks.barrier()
        finished = {}
        for shard in sorted(self.path.glob("rank*.records")):
            for payload in read_records(shard)[0]:
                finished[json.loads(payload.split(b"\n", 1)[0])["batch"]] = payload
        # Cut this rank's own torn tail, so what it appends next is readable.
        mine = self._shard()
        if mine.exists():
            with open(mine, "r+b") as f:
                f.truncate(read_records(mine)[1])
        return finished

    def append(self, payload: bytes) -> None:
        with open(self._shard(), "ab") as f:
            f.write(encode_record(payload))
            f.flush()
            os.fsync(f.fileno())
        self.appended += 1
        kill_if_asked(self.ranks, self.appended)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def _shard(self) -> Path:
        return self.path / f"rank{self.ranks.rank}.records"


def _write_synced(path: Path, data: bytes) -> None:
    """Whole or absent: written beside, synced, then renamed over."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
