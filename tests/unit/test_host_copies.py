"""Host data reaches a device only through samfast.transfer.to_device (pinned memory, no sync).

`torch.as_tensor(array, device="cuda")` copies from pageable memory, and that copy makes the CPU
wait for the GPU (a cudaStreamSynchronize). The GPU sync layer finds it, but only on a GPU: session
10's device resize shipped 8 such syncs per predict_batch that no CPU test could see. This check reads
samfast's source, so CI (no GPU) catches the pattern too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import samfast

MAKERS = {"as_tensor", "tensor", "asarray", "from_numpy"}  # torch functions that build a tensor from host data
ALLOWED = {"transfer.py"}  # the one place that copies host data to a device, through pinned memory


def _is_maker(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MAKERS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch")


def host_copies(source: str, filename: str = "<source>") -> list[str]:
    """'file:line: code' of every tensor built from host data straight onto a device, or moved there after."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        on_device = _is_maker(node) and any(k.arg == "device" for k in node.keywords)
        moved = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr in {"to", "cuda"} and _is_maker(node.func.value))
        if on_device or moved:
            found.append(f"{filename}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_no_module_copies_host_data_to_a_device_except_through_transfer():
    root = Path(samfast.__file__).parent
    files = [p for p in sorted(root.rglob("*.py")) if p.name not in ALLOWED]
    assert len(files) > 10  # it read the package
    found = [hit for p in files for hit in host_copies(p.read_text(), str(p.relative_to(root.parent)))]
    assert not found, ("host data copied to a device from pageable memory (a host-device sync on a GPU); "
                       "use samfast.transfer.to_device:\n" + "\n".join(found))


def test_planted_session_10_resize_copy_is_found():
    """Planted defect: the device resize's coefficient copies as commit 355f977 wrote them (before the fix in 10b67b2)."""
    planted = ("first = torch.as_tensor(first, device=device)\n"
               "weights = torch.as_tensor(weights, dtype=torch.int32, device=device)\n"
               "offsets = torch.from_numpy(counts).to(device)\n"
               "fine = torch.full((), 1, device=device)\n"  # made on the device: no copy
               "host = torch.as_tensor(mask)\n")  # stays on the host
    found = host_copies(planted)
    assert [line.split(":")[1] for line in found] == ["1", "2", "3"], found
