# Copyright Unity Technologies. Vendored from Unity-Technologies/ml-agents,
# ml-agents-envs/mlagents_envs/tests/test_timers.py, as test data for otel_rl's drop-in.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Modified: `mlagents_envs` -> `otel_rl` in the import and the patch target (two lines,
# marked "otel_rl:"). Nothing else is changed.
# ruff: noqa

from unittest import mock

from otel_rl import timers  # otel_rl: was `from mlagents_envs import timers`


@timers.timed
def decorated_func(x: int = 0, y: float = 1.0) -> str:
    timers.set_gauge("my_gauge", x + y)
    return f"{x} + {y} = {x + y}"


def test_timers() -> None:
    test_timer = timers.TimerStack()
    with mock.patch("otel_rl.timers._get_thread_timer", return_value=test_timer):  # otel_rl:
        # First, run some simple code
        with timers.hierarchical_timer("top_level"):
            for i in range(3):
                with timers.hierarchical_timer("multiple"):
                    decorated_func(i, i)

            raised = False
            try:
                with timers.hierarchical_timer("raises"):
                    raise RuntimeError("timeout!")
            except RuntimeError:
                raised = True

            with timers.hierarchical_timer("post_raise"):
                assert raised
                pass

        # We expect the hierarchy to look like
        #   (root)
        #       top_level
        #           multiple
        #               decorated_func
        #           raises
        #           post_raise
        root = test_timer.root
        assert root.children.keys() == {"top_level"}

        top_level = root.children["top_level"]
        assert top_level.children.keys() == {"multiple", "raises", "post_raise"}

        # make sure the scope was closed properly when the exception was raised
        raises = top_level.children["raises"]
        assert raises.count == 1

        multiple = top_level.children["multiple"]
        assert multiple.count == 3

        timer_tree = test_timer.get_timing_tree()

        expected_tree = {
            "name": "root",
            "total": mock.ANY,
            "count": 1,
            "self": mock.ANY,
            "children": {
                "top_level": {
                    "total": mock.ANY,
                    "count": 1,
                    "self": mock.ANY,
                    "children": {
                        "multiple": {
                            "total": mock.ANY,
                            "count": 3,
                            "self": mock.ANY,
                            "children": {
                                "decorated_func": {
                                    "total": mock.ANY,
                                    "count": 3,
                                    "self": mock.ANY,
                                }
                            },
                        },
                        "raises": {"total": mock.ANY, "count": 1, "self": mock.ANY},
                        "post_raise": {"total": mock.ANY, "count": 1, "self": mock.ANY},
                    },
                }
            },
            "gauges": {"my_gauge": {"value": 4.0, "max": 4.0, "min": 0.0, "count": 3}},
            "metadata": {
                "timer_format_version": timers.TIMER_FORMAT_VERSION,
                "start_time_seconds": mock.ANY,
                "end_time_seconds": mock.ANY,
                "python_version": mock.ANY,
                "command_line_arguments": mock.ANY,
            },
        }

        assert timer_tree == expected_tree
