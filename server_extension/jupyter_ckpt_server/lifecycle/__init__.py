"""One owner for each kernel's lifecycle: its state, its record and the pins on its images.

**The invariant.** At every instant, for every kernel that ran a cell, a new server on the
same store brings back a state at least as new as that kernel's newest committed image
(checkpoint, autosave or suspend), and no retention, delete, rekey or gc removes an image
that a record names. Only the user's own shutdown (or restart) drops a kernel's record.

How it holds: :class:`Lifecycles` (:mod:`.owner`) is the only code that writes or removes
a kernel record (``kernels/<id>.json``, through its :mod:`.records` part) and the only code
that changes a kernel's ckpt state. A record is replaced by a single atomic put, never
removed and rewritten, and its in-memory copy changes only once the put succeeded, so a
failed write leaves the previous record, and the image it pins, in force. Every external
entry point (the kernels and sessions API through
:class:`~jupyter_ckpt_server.kernelmanager.CkptKernelManager`, the websocket, the idle
monitor, the autosave scheduler, the stop guard, suspend-all, resume, delete, retention)
calls the owner; the owner runs each transition through its module (a plain class or
function that receives the owner and the parts it needs, under the kernel's lock); these
call the kernel (``rpc``), the store, the background saver and the kernel manager's
process primitives, and nothing calls back into them through a slot. One kernel's
transitions are serialized by its lock. A restore hands the kernel to the client whose
cell woke it before the record is written (the put follows under the lock).

Three rules keep the invariant where paths meet:

- **A pin lasts until a newer state is committed.** An image that holds a user's state
  stays pinned until a newer state of that kernel is committed and verified: an image
  that came from it (its ``parent`` chain leads to it). A failed restore is not a newer
  state, nor is what the kernel holds without it: while the kernel is ``restore-failed``
  every record it writes (autosave, checkpoint, suspend, stop) restores that image and
  keeps (``keeps``) the kernel's own newest image beside it
  (:meth:`.records.RecordKeeper.keeping`). A store that cannot be reached during a
  restore is waited for while the cell waits.
- **A cancelled write never lands later.** A record put or removal runs to its end on its
  thread; a task cancelled meanwhile stops once it has (:func:`.records.to_the_end`).
- **A message accepted for a kernel reaches the process that answers it, or the suspend
  aborts.** A websocket opened during a suspend is never attached to the process being
  suspended, and a message on a socket the suspend closed goes to the restored kernel
  (:mod:`jupyter_ckpt_server.websocket`).

States and the events that move a kernel (``TRANSITIONS`` in :mod:`.states`), with the
module that runs each; events that leave the state as it is, such as a cell, a checkpoint
(:mod:`.checkpoint`) or an interrupt, are not listed:

==============  ==========================  ==============  ========  ==========================
state           event                       next            module    its record in the store
==============  ==========================  ==============  ========  ==========================
(none)          start                       running         start     none yet
running         autosave tick               autosaving      autosave  (unchanged)
restore-failed  autosave tick               autosaving      autosave  (unchanged)
autosaving      autosave done or failed     running         autosave  running -> the new
                                                                      autosave
autosaving      done, image not restored    restore-failed  autosave  the image, keeping the
                                                                      new one
restore-failed  newer state of the image    running         records   running -> the newer
                                                                      image
restore-failed  its image resumed           running         resume    removed
running         suspend (idle, api, stop)   suspending      suspend   (unchanged)
restore-failed  suspend                     suspending      suspend   (unchanged)
suspending      committed                   suspended       suspend   suspended -> the new
                                                                      image (restore-failed:
                                                                      the image it failed
                                                                      on, keeping the new one)
suspending      failed or aborted           running         suspend   (unchanged)
suspended       first message, connect      restoring       restore   (unchanged)
restoring       restored                    running         restore   running -> the image
restoring       restore failed              restore-failed  restore   (unchanged: pins the
                                                                      image)
(none)          crash found at start        suspended       adopt     running, marked
                                                                      recovered
any             restart by the user         running         owner     removed: the state is
                                                                      given up
any             shutdown by the user        gone            owner     removed
any             shutdown by a server stop   gone            owner     kept: recoverable next
                                                                      start
==============  ==========================  ==============  ========  ==========================

Every change of a kernel's state, whichever module makes it, is told to its clients as a
``state`` event with the state they see (autosaving reads as running; ``gone`` after a
shutdown): each lifecycle is made by :meth:`.kernels.Kernels.new_lifecycle`, whose
``on_state`` hears every assignment of ``state``, so that no transition can forget it.

A save that finds the kernel's state unchanged since its newest image writes none (see
:mod:`jupyter_ckpt.image.identity`): the transition names that image instead of a new one.

A shutdown, restart or client message during a suspend aborts it at its next step; a
shutdown or restart during a restore makes it skip its image; an autosave in progress is
cancelled by a shutdown or restart, and waited for (within the deadline) by a suspend
(:meth:`Lifecycles.settle`).

The other modules: :mod:`.kernels` (what the owner shares with the transitions: the
kernels, their locks, the server's parts; the transitions receive the owner as this, so
none imports the owner back), :mod:`.records` (the record writes and the pins),
:mod:`.sessions` (a kernel's sessions, as its record keeps them), :mod:`.standby` (which
kernel specs have a process standing by), :mod:`.debugger` (the debugger's facts a
suspended kernel answers with).
"""

from .owner import Lifecycles
from .restore import restoring
from .states import TRANSITIONS, InvalidTransition, KernelLifecycle, State

__all__ = [
    "TRANSITIONS",
    "InvalidTransition",
    "KernelLifecycle",
    "Lifecycles",
    "State",
    "restoring",
]
