package interop;

import java.util.Base64;
import java.util.Set;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Seeds 001 and 003's pull consumer: DefaultMQPullConsumer (deprecated since 4.9.0, as seed 001
 * notes, but still in every client), which asks for the route's queues and pulls each one by
 * offset from its min offset to its max offset -- the application, not a rebalance service, owns
 * the offsets -- and with --commit stores where it stopped on the broker (updateConsumeOffset,
 * then the offset store's persist).  Prints every message (its body also as base64) and a
 * "queue" event per queue.
 *
 * --topic takes several topics, comma separated (no topic name has a comma): one after the other.
 *
 * --namesrv ADDR --group G --topic T[,T2...] [--sub-expr "TagA || TagB"] [--batch N] [--commit]
 */
@SuppressWarnings("deprecation")
final class PullConsumer {
    static int run(Opts opts) throws Exception {
        String topics = opts.str("topic");
        DefaultMQPullConsumer consumer = new DefaultMQPullConsumer(opts.str("group"));
        consumer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(consumer);
        consumer.start();
        try {
            for (String topic : topics.split(",")) {
                Set<MessageQueue> mqs = consumer.fetchSubscribeMessageQueues(topic);
                for (MessageQueue mq : mqs) {
                    long min = consumer.minOffset(mq);
                    long max = consumer.maxOffset(mq);
                    long offset = min;
                    int pulls = 0;
                    while (offset < max && pulls++ < 1000) {
                        PullResult result = consumer.pull(mq, opts.str("sub-expr", "*"), offset, opts.integer("batch", 32));
                        if (result.getMsgFoundList() != null) {
                            for (MessageExt msg : result.getMsgFoundList()) {
                                // the body exactly (Out.message's "body" is text): a check of what a
                                // store carried over reads its bytes
                                Out.message("received", msg)
                                    .put("bodyBase64", Base64.getEncoder().encodeToString(msg.getBody()))
                                    .emit();
                            }
                        }
                        if (result.getNextBeginOffset() <= offset) {
                            break;
                        }
                        offset = result.getNextBeginOffset();
                    }
                    if (opts.flag("commit")) {
                        consumer.updateConsumeOffset(mq, offset);
                        // a pull consumer owns no rebalanced queues, so shutdown() persists nothing:
                        // send this queue's offset to the broker now (UPDATE_CONSUMER_OFFSET)
                        consumer.getOffsetStore().persist(mq);
                    }
                    Out.event("queue").put("topic", topic).put("brokerName", mq.getBrokerName()).put("queueId", mq.getQueueId())
                        .put("minOffset", min).put("maxOffset", max).put("nextOffset", offset).emit();
                }
            }
        } finally {
            consumer.shutdown();
        }
        return 0;
    }
}
