"""The trainer: loop, optimizer, LR schedules, loss, metrics."""
