"""Starting training processes: the launcher (the config checked once, torchrun on this node, one
clear line and the failing rank's exit code at the end) and the program it starts on every rank
(rank.py). What each training process does about signals, its launcher's death and its last
word is kenotron/runtime/."""
