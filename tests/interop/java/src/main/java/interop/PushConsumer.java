package interop;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Seed 001 (ConsumeQueue and the consumer's pull and consume path): DefaultMQPushConsumer with
 * the settings the article walks through -- messageModel (CLUSTERING or BROADCASTING),
 * consumeFromWhere, the concurrent or orderly ConsumeMessageService, and the offset store the
 * model implies (the broker's in clustering, a local file in broadcasting) -- plus seed 003's
 * selectors (a tag expression, or MessageSelector.bySql("age between 10 and 20")).
 *
 * Runs --instances consumers of one group in this JVM and stops when --expect messages arrived
 * in total (then waits --settle-ms for any extra), or at --timeout-s (exit 3).
 *
 * --hold-file PATH keeps the consumers up after that (they print "expected") until PATH exists,
 * for 120 s at most (exit 4): up, they commit their offsets on their 5 s timer and finish sending
 * failed messages back, which a client shut down straight after its last message may not have
 * done yet (its last commit is a one-way request, its send-back runs on the consume thread).
 *
 * --namesrv ADDR --group G --topic T --expect N [--instances K] [--model clustering|broadcasting]
 * [--orderly] [--tag-expr "TagA || TagB"] [--sql EXPR] [--from first|last]
 * [--fail (always RECONSUME_LATER)] [--max-reconsume-times M] [--retry-delay-level L]
 * [--settle-ms MS] [--timeout-s S] [--hold-file PATH]
 *
 * Each rebalance prints "rebalanced-consumer-K-of-N" (instance K, N consumers in the group), so a
 * test can wait until every instance has taken its share of the queues.
 */
final class PushConsumer {
    static int run(Opts opts) throws Exception {
        int expect = opts.integer("expect", 1);
        long deadline = opts.deadlineMs(60);
        boolean fail = opts.flag("fail");
        int retryDelayLevel = opts.integer("retry-delay-level", 0);
        AtomicInteger received = new AtomicInteger();
        List<DefaultMQPushConsumer> consumers = new ArrayList<>();
        try {
            for (int k = 0; k < opts.integer("instances", 1); k++) {
                final String instance = "consumer-" + k;
                DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(opts.str("group"));
                consumer.setNamesrvAddr(opts.namesrv());
                Opts.loaded(consumer);
                consumer.setInstanceName(opts.str("group") + "-" + instance);
                consumer.setAllocateMessageQueueStrategy(announced(instance));
                Compat.setMessageModel(consumer, opts.str("model", "clustering").toUpperCase());
                consumer.setConsumeFromWhere("last".equals(opts.str("from", "first"))
                    ? ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET : ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
                if (opts.integer("max-reconsume-times", -1) >= 0) {
                    consumer.setMaxReconsumeTimes(opts.integer("max-reconsume-times", -1));
                }
                if (!opts.str("sql", "").isEmpty()) {
                    consumer.subscribe(opts.str("topic"), MessageSelector.bySql(opts.str("sql")));
                } else {
                    consumer.subscribe(opts.str("topic"), opts.str("tag-expr", "*"));
                }
                if (opts.flag("orderly")) {
                    consumer.registerMessageListener((MessageListenerOrderly) (msgs, context) -> {
                        for (var msg : msgs) {
                            Out.message("received", msg).put("instance", instance)
                                .put("thread", Thread.currentThread().getName()).emit();
                            received.incrementAndGet();
                        }
                        return ConsumeOrderlyStatus.SUCCESS;
                    });
                } else {
                    consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
                        for (var msg : msgs) {
                            Out.message("received", msg).put("instance", instance)
                                .put("retryTopic", msg.getProperty(MessageConst.PROPERTY_RETRY_TOPIC)).emit();
                            received.incrementAndGet();
                        }
                        if (fail) {
                            if (retryDelayLevel != 0) {
                                context.setDelayLevelWhenNextConsume(retryDelayLevel);
                            }
                            return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                        }
                        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                    });
                }
                consumer.start();
                consumers.add(consumer);
            }
            Out.event("started").emit();
            while (received.get() < expect) {
                if (System.currentTimeMillis() > deadline) {
                    return 3;
                }
                Thread.sleep(50);
            }
            Thread.sleep(opts.integer("settle-ms", 0));
            return hold(opts.str("hold-file", ""));
        } finally {
            for (DefaultMQPushConsumer consumer : consumers) {
                consumer.shutdown();
            }
        }
    }

    /** RocketMQ's default allocation (averagely), printing each rebalance's outcome. */
    static AllocateMessageQueueStrategy announced(String instance) {
        AllocateMessageQueueAveragely averagely = new AllocateMessageQueueAveragely();
        return new AllocateMessageQueueStrategy() {
            @Override
            public List<MessageQueue> allocate(String group, String currentCid, List<MessageQueue> mqAll,
                                               List<String> cidAll) {
                List<MessageQueue> mine = averagely.allocate(group, currentCid, mqAll, cidAll);
                Out.event("rebalanced-" + instance + "-of-" + cidAll.size()).put("queues", mine.size()).emit();
                return mine;
            }

            @Override
            public String getName() {
                return averagely.getName();
            }
        };
    }

    /** Waits for the file a test creates when it is done with the running consumers. */
    static int hold(String file) throws InterruptedException {
        if (file.isEmpty()) {
            return 0;
        }
        Out.event("expected").emit();
        long until = System.currentTimeMillis() + 120_000;
        while (!Files.exists(Path.of(file))) {
            if (System.currentTimeMillis() > until) {
                return 4;
            }
            Thread.sleep(50);
        }
        return 0;
    }
}
