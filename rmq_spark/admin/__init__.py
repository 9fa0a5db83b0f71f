"""rmq-admin: administer rmq-broker or an Apache RocketMQ cluster over RocketMQ's remoting protocol
(:mod:`rmq_spark.admin.__main__` has the commands)."""
