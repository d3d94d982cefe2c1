# SPDX-License-Identifier: Apache-2.0
"""
The policy node as a managed lifecycle node (``lifecycle:=true``), as nav2 and ros2_control expect.

The same wiring as the plain node (``PolicyWiring``), driven by transitions:

* ``configure`` loads the checkpoint, warms it up and creates the topics, services and timers;
  inputs arrive but nothing is commanded;
* ``activate`` starts a fresh control loop and a new episode (the policy's cache is reset, and
  an answer to a request of an earlier activation is never taken for this one's): it commands
  once its inputs and an instruction *published after the activation* are there (a latched
  instruction from before, re-delivered to the new subscriptions, does not start motion by
  itself);
* ``deactivate`` publishes one hold (through the loop's one exit) and stops commanding; the
  policy stays loaded and warm;
* ``cleanup`` frees the policy and every entity ``configure`` created (so does a configure
  that fails, whatever the error);
* ``shutdown`` holds (when active), then frees everything.

Outside ``active`` no control tick, watchdog or chunk runs a loop, so nothing is published
on the command topic, and ``~/reset_episode`` answers that there is no episode to reset.
"""

from __future__ import annotations

import time
from typing import Any

from rclpy.lifecycle import LifecycleState, Node as LifecycleNode, TransitionCallbackReturn
from rclpy.subscription import MessageInfo
from std_msgs.msg import String
from std_srvs.srv import Trigger

from vla_policy_node.ros.node import main as run_node, NODE_NAME, PolicyWiring
from vla_policy_node.ros.params import ParameterError
from vla_policy_node.ros.policy_loader import PolicyLoadError

ENTITY_KINDS = ('timers', 'subscriptions', 'services', 'publishers', 'guards')


class VlaPolicyLifecycleNode(PolicyWiring, LifecycleNode):
    """Loads on configure, commands only while active, frees the policy on cleanup."""

    def __init__(self, **node_options: Any) -> None:
        LifecycleNode.__init__(self, NODE_NAME, **node_options)
        self._declare(node_options)
        self._active = False
        self._inference_started = False     # configure has started the inference thread
        self._activated_ns = 0          # wall clock (ns) of the last activation
        self._wired: dict[str, list] = {}
        self.get_logger().info('unconfigured: configure loads the policy, activate commands')

    # ------------------------------------------------------------------ transitions
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load and warm up the policy; create the loop's topics, services and timers."""
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
        self.get_logger().info(f'configured (inactive, not commanding): {self._model_description()}')
        return TransitionCallbackReturn.SUCCESS

    def _made_since(self, before: dict[str, set]) -> dict[str, list]:
        return {kind: [e for e in getattr(self, kind) if e not in before[kind]] for kind in ENTITY_KINDS}

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start a new control loop: new episode, no instruction, first command from the measured state."""
        self._loop = self._make_loop()
        self._loop.reset_episode('activate')        # the policy's cache and anything in flight: gone
        self._activated_ns = time.time_ns()
        self._active = True
        self._control_timer.reset()
        self.get_logger().info('active: commanding once the inputs and an instruction '
                               'published from now on are there')
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Publish one hold and stop commanding; the policy stays loaded and warm."""
        self._hold_and_pause()
        self.get_logger().info('inactive: holding, policy kept warm')
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Free the policy and everything configure created."""
        self._free()
        self.get_logger().info('unconfigured: policy freed')
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Hold (when active), then free everything."""
        self._hold_and_pause()
        self._free()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Hold and free everything; the node is then unconfigured."""
        self._hold_and_pause()
        self._free()
        return TransitionCallbackReturn.SUCCESS

    def _hold_and_pause(self) -> bool:
        """Send the last hold and wait (briefly) until the controllers have it: it may be freed next."""
        if not self._active:
            return False
        self._active = False
        self._control_timer.cancel()
        held = self._loop.stop(self._now())
        if held:
            self._outputs.wait_for_all_acked(1.0)
        return held

    def _free(self) -> None:
        self._active = False
        self._inference_started = False
        if self._worker is not None:
            self._worker.stop(timeout=2.0)
        if self._joint_states is not None:
            self._joint_states.destroy()
        for kind, entities in self._wired.items():
            destroy = getattr(self, {'guards': 'destroy_guard_condition'}.get(
                kind, f'destroy_{kind[:-1]}'))
            for entity in entities:
                destroy(entity)
        self._wired = {}
        self._loop = self._worker = self._joint_states = None
        self._policy = None
        self._frames = {}

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

    def _on_reset_episode(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        if self._active:
            return super()._on_reset_episode(request, response)
        response.success = False
        response.message = 'not active: there is no episode to reset'
        return response

    def _on_watchdog(self) -> None:
        if self._active:
            super()._on_watchdog()
        else:
            self._check_command_topic()

    def _on_frame(self, camera: str, raw: bytes) -> None:
        if self._active:
            super()._on_frame(camera, raw)

    def _on_instruction(self, msg: String, info: MessageInfo) -> None:
        """Take only instructions published while active: a latched one from before must not start motion."""
        published = info.get('source_timestamp', 0)
        if not self._active or (published and published < self._activated_ns):
            self.get_logger().info(
                'instruction published before the activation ignored: publish it again to start',
                throttle_duration_sec=5.0)
            return
        super()._on_instruction(msg)

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
        """On SIGINT/SIGTERM: hold if active, then stop inference; whether it has finished."""
        if self._active:
            self._active = False
            return super().stop()
        if self._worker is not None:
            return self._worker.stop(timeout=2.0)
        return True


def main(args: list[str] | None = None) -> int:
    """Run the lifecycle node until SIGINT/SIGTERM (exit 0), see ``ros.node.main``."""
    return run_node(args, node_class=VlaPolicyLifecycleNode)
