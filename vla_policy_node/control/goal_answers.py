# SPDX-License-Identifier: Apache-2.0
"""
What a controller made of the goals it was sent, and whether its command group may be commanded.

A topic's subscriber takes every message; an action server answers each goal, and the answer
says whether the controller runs it. The control loop assumes the controllers execute what
it sent (``holds.Holds.executing``): every command steps from there. A goal the controller
did not run makes that assumption false, so the group is *refused* until ``quiet`` seconds
pass without another:

* rejected (an inactive joint_trajectory_controller, joints it does not own);
* aborted (a tolerance violated; a gripper that stalls on what it grasps is not a failure);
* ended SUCCEEDED before ``early`` of its trajectory's duration had passed: it did not run it;
* no answer to the goal request within ``response_timeout`` (a controller that hangs, an action
  server gone with goals in flight).

Each refusal in a row without a goal run in between doubles the quiet, up to ``MAX_QUIET_S``:
a controller that stays off is sent a goal (stepping from the measured joints) every few
seconds, not every tick, and after a refusal the loop holds again until that first goal has
run its first point's time without failing (accepted is not enough: an abort comes after).
A refusal also stops what the controller still runs (``on_refused``: the caller cancels its
running goals): a controller that refuses the next goal goes on with the last one it took,
which steps on from a plan the loop has dropped. While refused the loop holds and the group's
joints are *unheard*
(``ControlLoop.set_command_link``): the next goal steps from their measured state. So does a
goal sent after one held back, or after one accepted late (:attr:`GoalAnswers.awaiting`): one
accepted late (past half its first point's time) started later than the loop assumes. A goal is
held back while the previous request is not answered (:meth:`GoalAnswers.may_send`): a controller
that hangs would otherwise queue a goal per tick, each stepping from older joints, and run them all
when it wakes; it gets one per quiet instead. A goal
accepted after it was given up for unanswered is to be cancelled at once: a newer goal from
the measured joints stands in its place. A goal preempted by the next one (canceled) is how
every goal ends in normal running. ROS-free: ``ros/action_outputs.py`` feeds it the answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import enum
import math

RESPONSE_TIMEOUT_S = 0.5    # a controller answers a goal request in milliseconds (a loaded Python one: 100s)
LATE_ACCEPT = 0.5           # accepted later than this fraction of its first point's time: started late
QUIET_S = 1.0               # after the last goal not run, before the group is commanded again
MAX_QUIET_S = 8.0           # ... doubled for each refusal in a row, up to this
EARLY_SUCCESS = 0.5         # SUCCEEDED before this fraction of its trajectory's duration: not run
LOG_PERIOD_S = 5.0          # between warnings of one kind (all are counted)
COUNTERS = ('command_goals_sent', 'command_goals_rejected', 'command_goals_failed',
            'command_goals_unanswered', 'command_goals_not_run')


class Outcome(enum.Enum):
    """How a goal the controller accepted ended."""

    SUCCEEDED = 'succeeded'
    ABORTED = 'aborted'
    CANCELED = 'canceled'


@dataclass
class _Sent:
    """A goal in flight: when it left (loop clock, wall clock), when its first and last points are due."""

    sent_at: float
    wall_sent_at: float
    first_due: float
    duration: float
    accepted_at: float | None = None       # wall clock


class GoalAnswers:
    """The answers of one command group's controller; ``refusal`` says whether it may be commanded."""

    def __init__(self, name: str, counters: dict[str, int], warn: Callable[[str], None] = lambda text: None,
                 response_timeout: float = RESPONSE_TIMEOUT_S, quiet: float = QUIET_S,
                 early: float = EARLY_SUCCESS, checks_timing: bool = True,
                 on_refused: Callable[[], None] = lambda: None) -> None:
        """
        ``name``: the controller, for the reasons; ``checks_timing``: an early success is a goal not run.

        ``on_refused``: called when a refusal starts, to cancel the goals the controller still runs.
        """
        self._name, self._counters, self._warn, self._on_refused = name, counters, warn, on_refused
        self._response_timeout, self._quiet, self._early = response_timeout, quiet, early
        self._checks_timing = checks_timing
        self._pending: dict[int, _Sent] = {}            # sent, not yet answered
        self._running: dict[int, _Sent] = {}            # accepted, not yet ended
        self._refused: tuple[str, float] | None = None  # (why, wall time of the last goal not run)
        self._strikes = 0                               # refusals since a goal last ran
        self._stale = False                             # one held back or accepted late: step from measured
        self._probing = False                           # the quiet ended: the next goal must show it runs
        self._probe: int | None = None                  # that goal, once sent
        self._logged: dict[str, float] = {}
        self.unanswered: list[int] = []                 # given up since the last look (for the record)

    def may_send(self) -> bool:
        """Tell whether a goal may leave now: not while a request is unanswered (it is held back, and noted)."""
        if self._pending:
            self._stale = True
        return not self._pending

    def sent(self, goal: int, now: float, wall: float, first_due: float, duration: float) -> None:
        """Note a goal that left at ``now`` (loop clock; ``wall``: monotonic), points due first_due..duration on."""
        self._pending[goal] = _Sent(now, wall, first_due, duration)
        self._stale = False
        if self._probing and self._probe is None:
            self._probe = goal
        self._counters['command_goals_sent'] += 1

    def responded(self, goal: int, accepted: bool, wall: float) -> bool:
        """Take the answer to a goal request; True when it accepts a goal given up already (cancel it)."""
        sent = self._pending.pop(goal, None)
        if not accepted:
            self._refuse('command_goals_rejected', 'rejected a goal', wall)
            return False
        if sent is None:
            return True
        self._stale = self._stale or wall - sent.wall_sent_at > LATE_ACCEPT * sent.first_due
        sent.accepted_at = wall
        self._running[goal] = sent
        return False

    def finished(self, goal: int, outcome: Outcome, now: float, wall: float, stalled: bool = False,
                 detail: str = '') -> None:
        """Take how an accepted goal ended; ``stalled``: a gripper holding what it grasps; ``detail``: why."""
        sent = self._running.pop(goal, None)
        ran = outcome == Outcome.CANCELED or stalled       # preempted by the next goal, or holding a grasp
        if outcome == Outcome.ABORTED and not stalled:
            self._refuse('command_goals_failed', f'aborted a goal{detail}', wall)
        elif outcome == Outcome.SUCCEEDED and sent is not None and self._checks_timing:
            elapsed = now - sent.sent_at
            ran = elapsed >= self._early * sent.duration
            if not ran:
                self._refuse('command_goals_not_run', f'ended a goal SUCCEEDED {elapsed:.3f} s after it was '
                                                      f'sent, before its {sent.duration:.3f} s trajectory was due: '
                                                      'it did not run it', wall)
        elif outcome == Outcome.SUCCEEDED:
            ran = True
        if ran and self._refused is None:
            self._strikes = 0

    @property
    def awaiting(self) -> bool:
        """Tell whether a goal is not answered yet, or the last was held back or accepted late: step from measured."""
        return bool(self._pending) or self._stale

    def refusal(self, wall: float) -> str | None:
        """Say why the group may not be commanded now, or None; gives up on goals unanswered too long."""
        late = [goal for goal, sent in self._pending.items() if wall - sent.wall_sent_at > self._response_timeout]
        for goal in late:
            del self._pending[goal]
        if late:
            self.unanswered.extend(late)
            self._counters['command_goals_unanswered'] += len(late) - 1
            self._refuse('command_goals_unanswered', f'gave no answer to a goal request within '
                                                     f'{self._response_timeout:g} s', wall)
        quiet = min(self._quiet * 2 ** max(self._strikes - 1, 0), max(MAX_QUIET_S, self._quiet))
        if self._refused is not None and wall - self._refused[1] >= quiet:
            self._refused, self._probing = None, True
        if self._refused is not None:
            return f'{self._name} {self._refused[0]}'
        if self._probing and self._probe is not None:
            probe = self._pending.get(self._probe) or self._running.get(self._probe)
            if probe is not None and (probe.accepted_at is None or wall - probe.accepted_at < probe.first_due):
                return f'{self._name} has not run the first goal sent after it ran none yet: holding'
            self._probing, self._probe = False, None
        return None

    def _refuse(self, counter: str, why: str, wall: float) -> None:
        """Refuse the group for ``quiet`` from now; count, and warn now and then."""
        self._counters[counter] += 1
        starts = self._refused is None
        if starts:
            self._strikes += 1
        self._probing, self._probe = False, None
        self._refused = (f'{why}: holding; the next goal steps from the measured joints', wall)
        if wall - self._logged.get(counter, -math.inf) >= LOG_PERIOD_S:
            self._logged[counter] = wall
            self._warn(f'{self._name} {why}')
        if starts:
            self._on_refused()
