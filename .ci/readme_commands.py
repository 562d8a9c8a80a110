"""Print the README's set-up commands (the non-comment lines of its first ``sh`` block), one
a line, so that .ci/run runs exactly what a user following the README runs."""

import re
import sys
from pathlib import Path

readme = Path(__file__).resolve().parents[1] / "README.md"
block = re.search(r"```sh\n(.*?)```", readme.read_text(), re.S)
if block is None:
    sys.exit(f"{readme}: no ```sh block with the set-up commands")
commands = [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]
if len(commands) != 2:
    sys.exit(f"{readme}: the first ```sh block must hold two commands (main job; tests), not {len(commands)}")
print("\n".join(commands))
