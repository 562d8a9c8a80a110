"""Block tables for the decode kernel: rebuilt on the host every step, or resident on the device.

Two strategies, same result (an int32 ``[num_seqs, width]`` table on the device whose
row ``i`` is the block table of the step's ``i``-th decode sequence):

- ``HostBlockTables``: every step, pad every sequence's table into one host array and
  copy all of it to the device (what a simple engine does; transfer grows with
  batch x context / block_size).
- ``ResidentBlockTables``: a device tensor ``[num_rows, max_blocks]`` keeps one row per
  live sequence; each step only rows whose table changed since the last upload (a new
  block every ``block_size`` tokens, a copy-on-write of the last block, a swap-in) are
  sent, then the step's rows are gathered on the device.

Both split their work into a host part (``prepare``: pure numpy, returns arrays to
upload) and a device part (``finish``: given the uploaded arrays), so the executor can
pack every per-step integer array into one host-to-device copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class TablePrep:
    """Host-side result of ``prepare``: named int32 arrays to upload, and how to use them."""

    arrays: dict[str, np.ndarray]
    num_seqs: int
    width: int
    rows_changed: int  # rows uploaded this step (== num_seqs for HostBlockTables)


class HostBlockTables:
    """Pad and upload every decode sequence's full table each step."""

    resident = False

    def prepare(self, seq_ids: list[int], tables: list[list[int]]) -> TablePrep:
        width = max((len(t) for t in tables), default=0) or 1
        out = np.zeros((len(tables), width), dtype=np.int32)  # [num_seqs, width]
        for row, table in enumerate(tables):
            out[row, :len(table)] = table
        return TablePrep({"tables": out}, len(tables), width, len(tables))

    def finish(self, prep: TablePrep, uploaded: dict[str, torch.Tensor]) -> torch.Tensor:
        return uploaded["tables"].view(prep.num_seqs, prep.width)  # [num_seqs, width] int32


class ResidentBlockTables:
    """Device-resident tables, one row per live sequence; only changed rows are uploaded.

    ``num_rows`` bounds the live sequences (max_num_seqs plus slack); rows of sequences
    absent from the current step are reclaimed least recently used first when needed.
    NOTE: the host keeps a copy of each uploaded row and compares the whole table (a
    C-level list compare), so any change -- append, copy-on-write, swap-in into new
    blocks -- is detected; never a stale row.
    """

    resident = True

    def __init__(self, num_rows: int, max_blocks: int, device: torch.device) -> None:
        self.num_rows, self.max_blocks = num_rows, max_blocks
        self.table = torch.zeros((num_rows, max_blocks), dtype=torch.int32, device=device)
        self._row_of: dict[int, int] = {}  # seq_id -> row
        self._uploaded: dict[int, list[int]] = {}  # seq_id -> table as last uploaded
        self._last_used: dict[int, int] = {}  # seq_id -> step
        self._free_rows = list(range(num_rows - 1, -1, -1))
        self._step = 0

    def _row(self, seq_id: int, in_step: set[int]) -> int:
        row = self._row_of.get(seq_id)
        if row is not None:
            return row
        if not self._free_rows:
            idle = [s for s in self._row_of if s not in in_step]
            if not idle:
                raise ValueError(f"more than {self.num_rows} sequences in one step: raise the "
                                 "resident block-table rows (max_num_seqs)")
            # reclaim the least recently used half of the idle rows at once (amortised O(1))
            idle.sort(key=self._last_used.__getitem__)
            for victim in idle[:max(1, len(idle) // 2)]:
                self._free_rows.append(self._row_of.pop(victim))
                self._uploaded.pop(victim, None)
                self._last_used.pop(victim, None)
        row = self._row_of[seq_id] = self._free_rows.pop()
        return row

    def prepare(self, seq_ids: list[int], tables: list[list[int]]) -> TablePrep:
        self._step += 1
        in_step = set(seq_ids)
        rows = np.empty(len(seq_ids), dtype=np.int32)
        changed_rows: list[int] = []
        changed: list[list[int]] = []
        for i, (seq_id, table) in enumerate(zip(seq_ids, tables)):
            if len(table) > self.max_blocks:
                raise ValueError(f"seq {seq_id} has {len(table)} blocks; the resident table holds "
                                 f"{self.max_blocks} (max_model_len / block_size)")
            row = self._row(seq_id, in_step)
            rows[i] = row
            self._last_used[seq_id] = self._step
            if self._uploaded.get(seq_id) != table:
                self._uploaded[seq_id] = table
                changed_rows.append(row)
                changed.append(table)
        width = max((len(t) for t in changed), default=0)
        data = np.zeros((len(changed), width), dtype=np.int32)
        for j, table in enumerate(changed):
            data[j, :len(table)] = table
        arrays = {"rows": rows, "changed_rows": np.asarray(changed_rows, dtype=np.int32),
                  "changed": data}
        return TablePrep(arrays, len(seq_ids), width, len(changed))

    def finish(self, prep: TablePrep, uploaded: dict[str, torch.Tensor]) -> torch.Tensor:
        if prep.rows_changed:
            data = uploaded["changed"].view(prep.rows_changed, prep.width)
            # NOTE: columns past a table's end may hold stale ids; the kernel reads only
            # ceil(context_len / block_size) entries of a row.
            self.table[uploaded["changed_rows"].long(), :prep.width] = data
        return self.table.index_select(0, uploaded["rows"].long())  # [num_seqs, max_blocks]


class Uploader:
    """Packs named int32 host arrays into one buffer and copies it to the device at once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pin = device.type == "cuda"

    ALIGN = 32  # int32 elements (128 bytes) between arrays: kernels see aligned pointers

    def upload(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """One host->device copy; returns flat int32 device views by name.

        NOTE: every view starts at a 128-byte aligned offset, so Triton's pointer
        specialisation (16-byte divisibility) is the same every step: no recompiles.
        """
        names = list(arrays)
        flat = [np.ascontiguousarray(arrays[n], dtype=np.int32).reshape(-1) for n in names]
        align = self.ALIGN
        total = sum(-(-max(a.size, 1) // align) * align for a in flat)
        host = torch.empty(total, dtype=torch.int32, pin_memory=self.pin)
        host_np = host.numpy()
        views, offset = {}, 0
        for name, a in zip(names, flat):
            host_np[offset:offset + a.size] = a
            views[name] = (offset, a.size)
            offset += -(-max(a.size, 1) // align) * align
        dev = host.to(self.device, non_blocking=True) if self.pin else host
        return {name: dev[o:o + n] for name, (o, n) in views.items()}
