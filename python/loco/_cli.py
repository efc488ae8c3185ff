"""The `loco` console script of the wheel: runs the `loco` program installed beside this
package (loco/bin/loco), with loco-train, the plugins and redis-server next to it."""
import os
import sys
from pathlib import Path


def main() -> None:
    program = Path(__file__).resolve().parent / "bin" / "loco"
    if not program.exists():
        sys.exit(f"loco: {program} is missing: this loco package has no programs "
                 "(an in-tree build: run build/bin/loco)")
    os.execv(str(program), [str(program), *sys.argv[1:]])


if __name__ == "__main__":
    main()
