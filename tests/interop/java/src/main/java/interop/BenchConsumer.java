package interop;

import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;

/**
 * The consume benchmark of bench/remoting_bench.py: a DefaultMQPushConsumer reading a topic from
 * its first offset until --count messages arrived.  Timed from the first message to the last.
 * Prints one "bench" line: messages, seconds.
 *
 * --namesrv ADDR --group G --topic T --count N [--timeout-s S]
 */
final class BenchConsumer {
    static int run(Opts opts) throws Exception {
        long count = opts.integer("count", 20000);
        long deadline = opts.deadlineMs(300);
        AtomicLong received = new AtomicLong();
        AtomicLong first = new AtomicLong();
        AtomicLong last = new AtomicLong();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(opts.str("group"));
        consumer.setNamesrvAddr(opts.namesrv());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPullBatchSize(32);
        consumer.subscribe(opts.str("topic"), "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            long now = System.nanoTime();
            first.compareAndSet(0, now);
            if (received.addAndGet(msgs.size()) >= count) {
                last.compareAndSet(0, now);
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        try {
            while (last.get() == 0) {
                if (System.currentTimeMillis() > deadline) {
                    return 3;
                }
                Thread.sleep(20);
            }
            Out.event("bench").put("messages", received.get()).put("seconds", (last.get() - first.get()) / 1e9).emit();
        } finally {
            consumer.shutdown();
        }
        return 0;
    }
}
