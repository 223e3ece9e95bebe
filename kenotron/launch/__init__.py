"""Starting and ending training processes: the launcher (torchrun, one clear line at the end) and
what each training process does about signals, its launcher's death and its last word."""
