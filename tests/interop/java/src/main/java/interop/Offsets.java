package interop;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Queue offsets, per queue of the topic: min and max offsets (GET_MIN_OFFSET / GET_MAX_OFFSET),
 * the offset for --timestamp (SEARCH_OFFSET_BY_TIMESTAMP, through the producer's MQAdmin API and
 * DefaultLitePullConsumer.offsetForTimestamp), the earliest store time, and the group's committed
 * offset (QUERY_CONSUMER_OFFSET) when --group-offsets names a group.
 *
 * --namesrv ADDR --group G --topic T [--timestamp MS] [--group-offsets GROUP]
 */
final class Offsets {
    @SuppressWarnings("deprecation")
    static int run(Opts opts) throws Exception {
        String topic = opts.str("topic");
        long timestamp = opts.longValue("timestamp", System.currentTimeMillis());
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group"));
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        producer.start();
        Opts.loadedAdmin(producer);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(opts.str("group-offsets", opts.str("group") + "-reader"));
        consumer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(consumer);
        consumer.setAutoCommit(false);
        consumer.start();
        Opts.loadedAdmin(consumer);
        try {
            List<MessageQueue> mqs = new ArrayList<>(consumer.fetchMessageQueues(topic));
            mqs.sort(Comparator.comparing(MessageQueue::getBrokerName).thenComparing(MessageQueue::getQueueId));
            for (MessageQueue mq : mqs) {
                long min = producer.minOffset(mq);
                long max = producer.maxOffset(mq);
                Out.Line line = Out.event("offsets").put("brokerName", mq.getBrokerName()).put("queueId", mq.getQueueId())
                    .put("minOffset", min).put("maxOffset", max)
                    .put("timestamp", timestamp)
                    .put("searchOffset", producer.searchOffset(mq, timestamp))
                    .put("offsetForTimestamp", consumer.offsetForTimestamp(mq, timestamp));
                if (max > min) {
                    line.put("earliestMsgStoreTime", producer.earliestMsgStoreTime(mq));
                }
                if (opts.str("group-offsets", null) != null) {
                    line.put("committed", consumer.committed(mq));
                }
                line.emit();
            }
        } finally {
            consumer.shutdown();
            producer.shutdown();
        }
        return 0;
    }
}
