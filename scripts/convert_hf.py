"""Convert between Hugging Face folders and kenotron checkpoints: `kenotron convert`, whose help
this prints (kenotron/checkpoint/convert_cli.py).

    python scripts/convert_hf.py to-hf outputs/debug hf_out
    python scripts/convert_hf.py to-kenotron Llama-3.2-1B ckpt --dtype bfloat16
"""

import sys

from kenotron.checkpoint.convert_cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python scripts/convert_hf.py"))
