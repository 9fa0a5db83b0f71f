package interop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * DefaultMQProducer in every send mode.  Message i has body "PREFIX i", tag tags[i % len],
 * key "KEYPREFIX-i", user properties i=i, age=i and the --props pairs.
 *
 * --namesrv ADDR --group G --topic T [--count N] [--mode sync|async|oneway|batch]
 * [--tags TagA,TagB] [--key-prefix K] [--body-prefix B] [--props a=1,b=2]
 * [--orders K (MessageQueueSelector: queue = orderId % queues, orderId = i % K; sync only)]
 * [--delay-level L]
 */
final class Producer {
    static int run(Opts opts) throws Exception {
        String topic = opts.str("topic");
        int count = opts.integer("count", 10);
        String mode = opts.str("mode", "sync");
        String[] tags = opts.str("tags", "TagA").split(",");
        String keyPrefix = opts.str("key-prefix", "key");
        String bodyPrefix = opts.str("body-prefix", "msg");
        int orders = opts.integer("orders", 0);
        int delayLevel = opts.integer("delay-level", 0);
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group"));
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        producer.start();
        Opts.routed(producer, topic);
        try {
            List<Message> msgs = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                Message msg = new Message(topic, tags[i % tags.length], keyPrefix + "-" + i,
                    (bodyPrefix + " " + i).getBytes(StandardCharsets.UTF_8));
                msg.putUserProperty("i", Integer.toString(i));
                msg.putUserProperty("age", Integer.toString(i));
                if (!opts.str("props", "").isEmpty()) {
                    for (String pair : opts.str("props").split(",")) {
                        String[] kv = pair.split("=", 2);
                        msg.putUserProperty(kv[0], kv[1]);
                    }
                }
                if (delayLevel > 0) {
                    msg.setDelayTimeLevel(delayLevel);
                }
                msgs.add(msg);
            }
            switch (mode) {
                case "sync":
                    for (int i = 0; i < count; i++) {
                        SendResult r;
                        if (orders > 0) {
                            MessageQueueSelector selector = (mqs, m, arg) -> mqs.get((Integer) arg % mqs.size());
                            r = producer.send(msgs.get(i), selector, i % orders);
                            Out.sent(r).put("i", i).put("orderId", i % orders).emit();
                        } else {
                            r = producer.send(msgs.get(i));
                            Out.sent(r).put("i", i).emit();
                        }
                    }
                    return 0;
                case "async": {
                    CountDownLatch done = new CountDownLatch(count);
                    AtomicInteger failed = new AtomicInteger();
                    for (int i = 0; i < count; i++) {
                        final int index = i;
                        producer.send(msgs.get(i), new SendCallback() {
                            @Override
                            public void onSuccess(SendResult r) {
                                Out.sent(r).put("i", index).emit();
                                done.countDown();
                            }

                            @Override
                            public void onException(Throwable e) {
                                Out.event("send-failed").put("i", index).put("message", String.valueOf(e)).emit();
                                failed.incrementAndGet();
                                done.countDown();
                            }
                        });
                    }
                    boolean ok = done.await(opts.integer("timeout-s", 30), TimeUnit.SECONDS);
                    return ok && failed.get() == 0 ? 0 : 3;
                }
                case "oneway":
                    for (int i = 0; i < count; i++) {
                        producer.sendOneway(msgs.get(i));
                        Out.event("sent-oneway").put("i", i).emit();
                    }
                    // a oneway send is flushed by the channel in the background: shutdown closes
                    // the channel, so wait as a running application would before it does
                    Thread.sleep(1000);
                    return 0;
                case "batch": {
                    SendResult r = producer.send(msgs);
                    Out.sent(r).put("batchSize", msgs.size()).emit();
                    return 0;
                }
                default:
                    throw new IllegalArgumentException("unknown --mode " + mode);
            }
        } finally {
            producer.shutdown();
        }
    }
}
