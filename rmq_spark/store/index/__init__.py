"""The IndexFile: CommitLog offsets by message key, in RocketMQ's layout, and the dispatcher that
feeds it."""
