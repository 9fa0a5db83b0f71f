package interop;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

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
        try {
            if (assign) {
                Collection<MessageQueue> mqs = consumer.fetchMessageQueues(topic);
                List<MessageQueue> queues = new ArrayList<>(mqs);
                consumer.assign(queues);
                String seek = opts.str("seek", "begin");
                for (MessageQueue mq : queues) {
                    if ("begin".equals(seek)) {
                        consumer.seekToBegin(mq);
                    } else {
                        consumer.seek(mq, Long.parseLong(seek));
                    }
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
}
