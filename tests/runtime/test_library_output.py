"""torch's own console output goes to the run's log (or nowhere) while kenotron's lines stay:
the single-process save warning, torch's loggers (device_mesh's), and the state after leaving."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator

import torch
import torch.distributed.checkpoint as dcp

from kenotron.runtime.library_output import library_output_to


def test_a_single_process_save_warns_into_the_log_not_onto_the_console(tmp_path, capfd):
    log = tmp_path / "logs" / "rank0_torch.log"
    with warnings.catch_warnings(), library_output_to(log):
        warnings.simplefilter("always")
        dcp.save({"w": torch.zeros(2)}, checkpoint_id=str(tmp_path / "ckpt"))
    assert "torch.distributed is disabled" not in capfd.readouterr().err
    assert "torch.distributed is disabled, unavailable or uninitialized" in log.read_text()


@contextlib.contextmanager
def torch_console() -> Iterator[io.StringIO]:
    """A console handler on torch.distributed's logger, as torch attaches its own at import (to a stream we can read)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger("torch.distributed").addHandler(handler)
    try:
        yield stream
    finally:
        logging.getLogger("torch.distributed").removeHandler(handler)


def test_torchs_logger_lines_go_to_the_log_and_kenotrons_stay_on_the_console(tmp_path):
    log = tmp_path / "torch.log"
    kenotron = logging.getLogger("kenotron.test_library_output")
    kenotron.addHandler(kenotron_console := logging.StreamHandler(io.StringIO()))
    try:
        with torch_console() as console, library_output_to(log):
            logging.getLogger("torch.distributed.device_mesh").warning("a device_mesh warning")
            kenotron.warning("a kenotron line")
    finally:
        kenotron.removeHandler(kenotron_console)
    assert "a device_mesh warning" not in console.getvalue()
    assert kenotron_console.stream.getvalue() == "a kenotron line\n"
    assert "torch.distributed.device_mesh WARNING: a device_mesh warning" in log.read_text()


def test_without_a_run_torchs_lines_are_dropped_and_after_leaving_they_show_again(recwarn):
    with torch_console() as console:
        with library_output_to(None):
            logging.getLogger("torch.distributed.device_mesh").warning("dropped")
            warnings.warn("a user's own warning", UserWarning, stacklevel=1)  # raised from this file: shown
        logging.getLogger("torch.distributed.device_mesh").warning("shown again")
    assert console.getvalue() == "shown again\n"
    assert [str(w.message) for w in recwarn] == ["a user's own warning"]
