# SPDX-License-Identifier: Apache-2.0
"""
The policy node as a managed lifecycle node (``lifecycle:=true``), as nav2 and ros2_control expect.

The same wiring as the plain node (``PolicyWiring``), driven by transitions:

* ``configure`` loads the checkpoint, warms it up and creates the topics, services and timers;
  inputs arrive but nothing is commanded;
* ``activate`` starts a fresh control loop and a new episode (the policy's cache is reset, and
  an answer to a request of an earlier activation is never taken for this one's): it commands
  once its inputs and an instruction *published after the activation* are there. The
  instruction subscription exists only while active and is volatile, so it never receives a
  sample published before it matched: a latched instruction from before does not start motion
  by itself, whichever clocks the hosts keep;
* ``deactivate`` publishes one hold (through the loop's one exit) and stops commanding; the
  policy stays loaded and warm;
* ``cleanup`` frees the policy and every entity ``configure`` created (so does a configure
  that fails, whatever the error). A policy step that does not end in time is left to finish
  with its result dropped; ``configure`` loads no second model while it runs;
* ``shutdown`` holds (when active), then frees everything.

Outside ``active`` no control tick, watchdog or chunk runs a loop, so nothing is published
on the command topic, ``~/reset_episode`` answers that there is no episode to reset, and
``~/restart_from_measured`` that activating starts from the measured state.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
import gc
import threading
from typing import Any

from rclpy.lifecycle import LifecycleState, Node as LifecycleNode, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy
from std_msgs.msg import String
from std_srvs.srv import Trigger
import torch

from vla_policy_node.control.inference import InferenceResult
from vla_policy_node.ros.node import main as run_node, model_description, NODE_NAME, PolicyWiring
from vla_policy_node.ros.params import ParameterError
from vla_policy_node.ros.policy_loader import PolicyLoadError
from vla_policy_node.ros.qos import INSTRUCTION_VOLATILE_QOS

ENTITY_KINDS = ('timers', 'subscriptions', 'services', 'publishers', 'guards', 'waitables')  # waitables: action clients
WORKER_STOP_S = 2.0     # how long cleanup and SIGINT wait for a running policy step
ORPHAN_WAIT_S = 5.0     # how long configure waits for a step cleanup left running


def _drop_result(result: InferenceResult) -> None:
    """Receive the result of a step of a freed policy: nothing may act on it."""


def _release_memory() -> None:
    """Collect what the freed policy leaves in cycles and hand cached CUDA memory back."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _transition(callback: Callable[[Any, LifecycleState], TransitionCallbackReturn]) -> Callable:
    """
    Run ``callback`` holding the transition lock, named, for ``stop`` on another thread.

    ``stop`` takes the same lock without waiting: a transition that starts while it runs (a
    lifecycle manager shutting the node down on the same Ctrl-C) waits for it, rather than
    free what it is using.
    """
    @functools.wraps(callback)
    def run(self: VlaPolicyLifecycleNode, state: LifecycleState) -> TransitionCallbackReturn:
        with self._transition_lock:
            self._transition_name = callback.__name__[len('on_'):]
            try:
                return callback(self, state)
            finally:
                self._transition_name = None
    return run


def _while_active(refusal: str) -> Callable:
    """Answer a Trigger service only while active; otherwise refuse it with ``refusal``."""
    def wrap(handler: Callable[[Any, Trigger.Request, Trigger.Response], Trigger.Response]) -> Callable:
        @functools.wraps(handler)
        def answer(self: VlaPolicyLifecycleNode, request: Trigger.Request,
                   response: Trigger.Response) -> Trigger.Response:
            if self._active:
                return handler(self, request, response)
            response.success, response.message = False, refusal
            return response
        return answer
    return wrap


class VlaPolicyLifecycleNode(PolicyWiring, LifecycleNode):
    """Loads on configure, commands only while active, frees the policy on cleanup."""

    INSTRUCTION_PROFILES = ()       # subscribed only while active: see on_activate

    def __init__(self, **node_options: Any) -> None:
        LifecycleNode.__init__(self, NODE_NAME, **node_options)
        self._declare(node_options)
        self._active = False
        self._inference_started = False     # configure has started the inference thread
        self._transition_lock = threading.Lock()
        self._transition_name: str | None = None
        self._instruction_sub = None
        self._orphan = None     # the inference of a freed policy, its step still running
        self._wired: dict[str, list] = {}
        self.get_logger().info('unconfigured: configure loads the policy, activate commands')

    # ------------------------------------------------------------------ transitions
    @_transition
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load and warm up the policy; create the loop's topics, services and timers."""
        if not self._orphan_ended(ORPHAN_WAIT_S):
            self.get_logger().error(
                f'configure failed: a step of the previous policy still runs {ORPHAN_WAIT_S:g} s after '
                'this configure began; a second model is not loaded beside it: configure again once it has ended')
            return TransitionCallbackReturn.FAILURE
        before = {kind: set(getattr(self, kind)) for kind in ENTITY_KINDS}
        try:
            self._load()
            self._wire()
            self._control_timer.cancel()            # ticks start with the activation
            self._worker.start()
            self._inference_started = True
        except Exception as error:  # noqa: B902 - whatever failed, free what was made and say why
            known = isinstance(error, (PolicyLoadError, ParameterError, ValueError))
            self.get_logger().error(f'configure failed: {error if known else repr(error)}')
            self._wired = self._made_since(before)
            self._free()
            return TransitionCallbackReturn.FAILURE
        self._wired = self._made_since(before)
        described = model_description(self._settings, self._policy)
        self.get_logger().info(f'configured (inactive, not commanding): {described}')
        return TransitionCallbackReturn.SUCCESS

    def _made_since(self, before: dict[str, set]) -> dict[str, list]:
        return {kind: [e for e in getattr(self, kind) if e not in before[kind]] for kind in ENTITY_KINDS}

    @_transition
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start a new control loop: new episode, no instruction, first command from the measured state."""
        self._loop = self._make_loop()
        self._loop.reset_episode('activate')        # the policy's cache and anything in flight: gone
        self._frame_sizes = {}            # a camera may have been reconfigured meanwhile: learn again
        for _, frames in self._cameras:   # frames received while inactive are not observations
            frames.take_all()
        self._active = True
        self._subscribe_instruction()
        self._control_timer.reset()
        self.get_logger().info('active: commanding once the inputs and an instruction '
                               'published from now on are there')
        return super().on_activate(state)

    def _subscribe_instruction(self) -> None:
        """
        Subscribe to the instruction, volatile: it never receives a sample published before it matched.

        Comparing a sample's source timestamp with the activation time would compare two hosts'
        clocks. A volatile reader also matches latched (transient-local) publishers, so one
        subscription takes every instruction published from now on, each once.
        """
        self._instruction_sub = self.create_subscription(
            String, self._settings.instruction_topic, self._on_instruction, INSTRUCTION_VOLATILE_QOS, raw=True)
        latched = [info for info in self.get_publishers_info_by_topic(self._instruction_sub.topic_name)
                   if info.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL]
        if latched:
            self.get_logger().info('an instruction latched before the activation is not taken: '
                                   'publish it again to start')

    def _unsubscribe_instruction(self) -> None:
        if self._instruction_sub is not None:
            self.destroy_subscription(self._instruction_sub)
            self._instruction_sub = None

    @_transition
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Publish one hold and stop commanding; the policy stays loaded and warm."""
        self._hold_and_pause()
        self.get_logger().info('inactive: holding, policy kept warm')
        return super().on_deactivate(state)

    @_transition
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Free the policy and everything configure created."""
        self._free()
        if self._orphan is None:
            self.get_logger().info('unconfigured: policy freed')
        else:
            self.get_logger().warning(
                f'unconfigured, but a policy step still runs after {WORKER_STOP_S:g} s: its result is '
                'dropped, the model stays in memory until it ends, and configure waits for that')
        return super().on_cleanup(state)

    @_transition
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Hold (when active), then free everything."""
        self._hold_and_pause()
        self._free()
        return super().on_shutdown(state)

    @_transition
    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Hold and free everything; the node is then unconfigured."""
        self._hold_and_pause()
        self._free()
        return TransitionCallbackReturn.SUCCESS

    def _hold_and_pause(self) -> bool:
        """Send the last hold and wait (briefly) until the controllers have it: it may be freed next."""
        if not self._active:
            return False
        self._task.abort('the lifecycle node left active: holding')
        self._active = False
        self._unsubscribe_instruction()
        self._control_timer.cancel()
        held = self._loop.stop(self._now())
        if held:
            self._outputs.wait_for_all_acked(1.0)
        return held

    def _free(self) -> None:
        """
        Destroy what configure made and drop every reference to the policy, so it is freed now.

        The loop holds the inference and the inference the loop's result callback: rebinding
        breaks that cycle (else only a garbage collection would free the model) and makes sure a
        step still running reaches no loop. Such a step's inference is kept as the orphan.
        """
        self._active = False
        self._inference_started = False
        self._unsubscribe_instruction()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.bind(_drop_result)
            if not worker.stop(timeout=WORKER_STOP_S):
                self._orphan = worker
        for subscription in self._polled():
            subscription.destroy()
        for kind, entities in self._wired.items():
            for entity in entities:
                if kind == 'waitables':     # an action client destroys its handle and leaves the node
                    getattr(entity, 'destroy', lambda: self.remove_waitable(entity))()
                else:
                    getattr(self, {'guards': 'destroy_guard_condition'}.get(kind, f'destroy_{kind[:-1]}'))(entity)
        self._wired = {}
        self._loop = self._joint_states = None
        self._cameras = ()
        self._policy = None
        self._frame_sizes = {}
        _release_memory()

    def _orphan_ended(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a step cleanup left running; whether none runs now."""
        if self._orphan is None:
            return True
        if not self._orphan.stop(timeout):
            return False
        self._orphan = None
        _release_memory()
        return True

    # ------------------------------------------------------------------ gated callbacks
    def _on_control_tick(self) -> None:
        if self._active:
            super()._on_control_tick()

    def _on_chunk_ready(self) -> None:
        if self._active:
            super()._on_chunk_ready()

    def _on_diagnostics_tick(self) -> None:
        if self._worker is not None:
            super()._on_diagnostics_tick()

    def _task_refusal(self) -> str | None:
        return None if self._active else 'not active: activate the node first'

    @_while_active('not active: there is no episode to reset')
    def _on_reset_episode(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        return super()._on_reset_episode(request, response)

    @_while_active('not active: activating starts from the measured joint state')
    def _on_restart_from_measured(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        return super()._on_restart_from_measured(request, response)

    def _on_watchdog(self) -> None:
        if self._active:
            super()._on_watchdog()
        else:
            self._check_command_topic()

    # ------------------------------------------------------------------ shutdown
    @property
    def inference_alive(self) -> bool:
        """
        Tell whether the inference thread runs, or none is needed yet.

        ``main`` polls this from its own thread while configure runs in the executor's:
        between loading the worker and starting it (creating the topics takes a while on
        a loaded machine), a not-yet-started thread is not a dead one.
        """
        worker = self._worker
        return not self._inference_started or worker is None or worker.alive

    def stop(self) -> bool:
        """
        On SIGINT/SIGTERM: hold if active, then stop inference; whether every thread has finished.

        A transition still running (configure loading a model) or a step cleanup left running
        cannot be interrupted: not finished, so ``main`` ends the process without waiting for it.
        """
        if not self._transition_lock.acquire(blocking=False):
            self.get_logger().info(f'stopped during {self._transition_name or "a transition"}: '
                                   'not waiting for it to end')
            return False
        try:
            finished = True
            if self._active:
                self._active = False
                finished = super().stop()
            elif self._worker is not None:
                finished = self._worker.stop(timeout=WORKER_STOP_S)
            if not self._orphan_ended(WORKER_STOP_S):
                self.get_logger().info('stopped: a step of the freed policy still runs, not waiting for it to end')
                return False
            return finished
        finally:
            self._transition_lock.release()


def main(args: list[str] | None = None) -> int:
    """Run the lifecycle node until SIGINT/SIGTERM (exit 0), see ``ros.node.main``."""
    return run_node(args, node_class=VlaPolicyLifecycleNode)
