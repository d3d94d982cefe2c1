# SPDX-License-Identifier: Apache-2.0
"""LeRobotDataset v3.0 read without LeRobot (pyarrow tables, PyAV video); no ROS, no torch."""
