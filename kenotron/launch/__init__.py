"""Starting training processes: the launcher (torchrun on this node, one clear line and the
failing rank's exit code at the end). What each training process does about signals, its
launcher's death and its last word is kenotron/train/worker_guard.py."""
