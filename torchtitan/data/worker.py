"""Signals in the loader's worker process: it stops when the training process stops it, not before.

torchrun stops a rank by signalling the rank's whole process group (``os.killpg``), and Ctrl-C in a
terminal signals the whole foreground group, so the worker receives the SIGTERM or SIGINT meant
for the training process. With PyTorch's defaults it would die of it, and the training process,
which is finishing its step (reading more batches) and saving its checkpoint before exiting (see
``PreemptionGuard`` in ``train.py``), would fail with "DataLoader worker ... killed by signal".

So the worker ignores SIGINT, and ignores SIGTERM unless the training process itself sends it:
that is how the DataLoader, and ``multiprocessing`` at interpreter exit, stop a worker that does
not answer its shutdown request. SIGKILL still ends it (torchrun's last resort reaches the whole
group), and PyTorch's watchdog ends it within seconds when the training process is gone.
"""

import functools
import os
import signal
import threading
from collections.abc import Callable


def worker_init_for(training_pid: int) -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn`` that applies this module's signal rules."""
    return functools.partial(guard_worker_signals, training_pid)


def guard_worker_signals(training_pid: int, worker_id: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):  # macOS: keep PyTorch's SIGTERM handling
        return
    # Blocked here and in every thread started from here on, so only the waiter receives it; it
    # can then tell who sent it, which a signal handler cannot.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    waiter = threading.Thread(
        target=exit_on_sigterm_from,
        args=(training_pid,),
        name="sigterm-waiter",
        daemon=True,
    )
    waiter.start()


def exit_on_sigterm_from(training_pid: int) -> None:
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == training_pid:
            os._exit(0)
