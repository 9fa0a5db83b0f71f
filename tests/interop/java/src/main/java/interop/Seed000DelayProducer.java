package interop;

import java.nio.charset.StandardCharsets;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;

/**
 * Seed 000 ("RocketMQ4源码(四)生产者特性", 一、延迟消息): the delay-level producer as the article
 * writes it; only the NameServer address, group, topic and the message count are arguments.
 *
 * --namesrv ADDR --group G --topic T [--count N] [--delay-level L (3 = 10s, as in the article)]
 */
final class Seed000DelayProducer {
    static int run(Opts opts) throws Exception {
        int count = opts.integer("count", 1);
        int delayLevel = opts.integer("delay-level", 3);
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group", "producer-group-1"));
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        producer.start();
        Opts.routed(producer, opts.str("topic"));
        try {
            for (int i = 0; i < count; i++) {
                Message msg = new Message(
                    opts.str("topic"), // topic
                    "TagA", // tag
                    ("Hello Delay " + i).getBytes(StandardCharsets.UTF_8) // body
                );
                msg.setDelayTimeLevel(delayLevel); // 延迟级别=3 10s
                SendResult sendResult = producer.send(msg); // 发送消息
                Out.sent(sendResult).put("i", i).put("delayLevel", delayLevel).emit();
            }
        } finally {
            producer.shutdown();
        }
        return 0;
    }
}
