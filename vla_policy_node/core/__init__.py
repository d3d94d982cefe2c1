"""The ROS-free core: models, prefix cache, runtime, preprocessing, chunk scheduling, safety."""
