"""Generate text from a run, a checkpoint or a Hugging Face folder: `kenotron generate`, whose help
this prints (kenotron/generate/cli.py).

    python scripts/run_generate.py --run outputs/debug --prompt "def fib(n):" --max-new-tokens 64
"""

import sys

from kenotron.generate.cli import run

if __name__ == "__main__":
    sys.exit(run(prog="python scripts/run_generate.py"))
