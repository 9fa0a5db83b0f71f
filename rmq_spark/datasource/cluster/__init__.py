"""Reads of a RocketMQ cluster (option ``namesrvAddr``): ``offsets`` (per topic, broker and
queue), ``planner`` (routes and snapshots on the driver), ``read`` (PULL_MESSAGE on executors),
``stream`` and ``batch`` (the two readers)."""
