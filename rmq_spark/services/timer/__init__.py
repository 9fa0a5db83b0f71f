"""Timer messages (RocketMQ 5's TimerMessageStore): any delivery time, with recall."""
