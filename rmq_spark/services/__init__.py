"""RocketMQ's services above the store, a package each: ``schedule`` (delay levels), ``timer``
(timer messages and recall), ``transaction`` (half messages, end transaction, check-back) and the
``redelivery`` they share; ``core`` composes them with a store into a :class:`BrokerCore`.

They use the store only through its public interface (puts, reads, ConsumeQueues, offsets) and
system topics; the store knows nothing of them.
"""
