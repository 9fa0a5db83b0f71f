package interop;

import java.nio.charset.StandardCharsets;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;

/**
 * Seed 004 ("启动你的RocketMQ之旅(三)-Producer启动和发送流程"): a producer that finds the brokers
 * through its NameServer address (producer.setNamesrvAddr), starts (producer.start(): route
 * lookup, heartbeats), turns on send-latency fault tolerance as the article does
 * (producer.setSendLatencyFaultEnable(true)) and sends synchronously; the queue is chosen by the
 * client from the route.  Prints each SendResult, so the test sees which brokers and queues were
 * used.
 *
 * --namesrv ADDR --group G --topic T [--count N] [--body-prefix B]
 */
final class Seed004Producer {
    static int run(Opts opts) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group"));
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        producer.setSendLatencyFaultEnable(true); // 打开发送延迟故障容忍
        producer.start();
        Opts.routed(producer, opts.str("topic"));
        try {
            int count = opts.integer("count", 8);
            for (int i = 0; i < count; i++) {
                Message msg = new Message(opts.str("topic"), "TagA", (opts.str("body-prefix", "seed004") + " " + i).getBytes(StandardCharsets.UTF_8));
                SendResult sendResult = producer.send(msg);
                Out.sent(sendResult).put("i", i).emit();
            }
        } finally {
            producer.shutdown();
        }
        return 0;
    }
}
