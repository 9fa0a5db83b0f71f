"""Delay levels (RocketMQ's ScheduleMessageService): ``SCHEDULE_TOPIC_XXXX`` delivered exactly once."""
