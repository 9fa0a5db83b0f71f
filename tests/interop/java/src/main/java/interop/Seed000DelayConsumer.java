package interop;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;

/**
 * Seed 000's consumer side of delay messages: "延迟消息的生产和消费,对于Producer和Consumer实例并没有
 * 特殊的操作" -- a plain push consumer.  Prints each message with its born and store timestamps
 * and the time it arrived, so the test can check the delay level was honoured.
 *
 * --namesrv ADDR --group G --topic T --expect N [--timeout-s S]
 */
final class Seed000DelayConsumer {
    static int run(Opts opts) throws Exception {
        int expect = opts.integer("expect", 1);
        long deadline = opts.deadlineMs(60);
        CountDownLatch done = new CountDownLatch(expect);
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(opts.str("group"));
        consumer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(consumer);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(opts.str("topic"), "TagA");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            for (var msg : msgs) {
                Out.message("received", msg).emit();
                done.countDown();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        Out.event("started").emit();
        try {
            boolean ok = done.await(Math.max(0, deadline - System.currentTimeMillis()), TimeUnit.MILLISECONDS);
            return ok ? 0 : 3;
        } finally {
            consumer.shutdown();
        }
    }
}
