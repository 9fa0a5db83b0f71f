package interop;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.exception.RemotingSendRequestException;

/**
 * DefaultLitePullConsumer, in its two modes:
 *  - assign: takes every queue of the topic, seeks each one to --seek (an offset; "begin" = its
 *    min offset) and polls;
 *  - subscribe: joins the group's rebalance from the first offset, with a tag or SQL92 selector,
 *    and commits automatically.
 * Stops when --expect messages arrived (then polls --settle-ms more, to see extras), or at
 * --timeout-s (exit 3).
 *
 * --namesrv ADDR --group G --topic T --expect N [--mode assign|subscribe] [--seek OFFSET|begin]
 * [--tag-expr E] [--sql E] [--settle-ms MS] [--timeout-s S]
 */
final class LitePullConsumer {
    static int run(Opts opts) throws Exception {
        String topic = opts.str("topic");
        int expect = opts.integer("expect", 1);
        long deadline = opts.deadlineMs(60);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(opts.str("group"));
        consumer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(consumer);
        consumer.setPollTimeoutMillis(1000);
        boolean assign = "assign".equals(opts.str("mode", "subscribe"));
        if (assign) {
            consumer.setAutoCommit(false);
        } else {
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            if (!opts.str("sql", "").isEmpty()) {
                consumer.subscribe(topic, MessageSelector.bySql(opts.str("sql")));
            } else {
                consumer.subscribe(topic, opts.str("tag-expr", "*"));
            }
        }
        consumer.start();
        Opts.loadedAdmin(consumer);
        try {
            if (assign) {
                Collection<MessageQueue> mqs = consumer.fetchMessageQueues(topic);
                List<MessageQueue> queues = new ArrayList<>(mqs);
                consumer.assign(queues);
                String seek = opts.str("seek", "begin");
                for (MessageQueue mq : queues) {
                    seek(consumer, mq, seek);
                    Out.event("assigned").put("brokerName", mq.getBrokerName()).put("queueId", mq.getQueueId()).emit();
                }
            }
            Out.event("started").emit();
            int received = 0;
            long settleUntil = Long.MAX_VALUE;
            while (System.currentTimeMillis() < Math.min(settleUntil, deadline)) {
                for (MessageExt msg : consumer.poll(500)) {
                    Out.message("received", msg).emit();
                    received++;
                }
                if (received >= expect && settleUntil == Long.MAX_VALUE) {
                    settleUntil = System.currentTimeMillis() + opts.integer("settle-ms", 0);
                }
            }
            return received >= expect ? 0 : 3;
        } finally {
            consumer.shutdown();
        }
    }

    /**
     * seek() or seekToBegin(), tried up to three times.  rocketmq-client 5.5.0's seek() interrupts
     * the queue's pull task; when that task is inside a request (the QUERY_CONSUMER_OFFSET of a new
     * group's first pull), the interrupted request fails and the client closes its channel to the
     * broker, failing every other request in flight on it: this seek's own GET_MIN_OFFSET too
     * ("send request to <addr> failed", the client's log naming the InterruptedException).  The
     * broker answered; the next request opens a new channel.  A retry is printed ("seek-retried").
     */
    static void seek(DefaultLitePullConsumer consumer, MessageQueue mq, String seek) throws MQClientException {
        for (int attempt = 1; ; attempt++) {
            try {
                if ("begin".equals(seek)) {
                    consumer.seekToBegin(mq);
                } else {
                    consumer.seek(mq, Long.parseLong(seek));
                }
                return;
            } catch (MQClientException e) {
                if (attempt == 3 || !(e.getCause() instanceof RemotingSendRequestException)) {
                    throw e;
                }
                Out.event("seek-retried").put("queueId", mq.getQueueId()).put("attempt", attempt).emit();
            }
        }
    }
}
