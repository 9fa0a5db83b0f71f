package interop;

import java.nio.charset.StandardCharsets;

import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The clients with RocketMQ's plain ACL (AclClientRPCHook signing every request with an access
 * key and secret): a producer sends --count messages (each failure printed as a "send-error"
 * event with the broker's response code, not fatal), then, with --consume-as AK:SK, a DefaultLitePullConsumer subscribed from the
 * first offset reads until --count arrived or --timeout-s.
 *
 * --namesrv ADDR --group G --topic T --access-key AK --secret-key SK [--count N]
 * [--consume-as AK:SK] [--timeout-s S]
 */
final class AclClients {
    static int run(Opts opts) throws Exception {
        String topic = opts.str("topic");
        int count = opts.integer("count", 3);
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group") + "_p",
            new AclClientRPCHook(new SessionCredentials(opts.str("access-key"), opts.str("secret-key"))));
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        producer.setRetryTimesWhenSendFailed(0);
        producer.start();
        try {
            for (int i = 0; i < count; i++) {
                try {
                    SendResult r = producer.send(new Message(topic, "acl", ("acl " + i).getBytes(StandardCharsets.UTF_8)));
                    Out.sent(r).put("i", i).emit();
                } catch (Exception e) {
                    int code = -1;
                    for (Throwable t = e; t != null; t = t.getCause()) {
                        if (t instanceof MQBrokerException) {
                            code = ((MQBrokerException) t).getResponseCode();
                        }
                    }
                    Out.event("send-error").put("i", i).put("type", e.getClass().getName()).put("code", code)
                        .put("message", String.valueOf(e.getMessage())).emit();
                }
            }
        } finally {
            producer.shutdown();
        }
        String consumeAs = opts.str("consume-as", "");
        if (consumeAs.isEmpty()) {
            return 0;
        }
        String[] cred = consumeAs.split(":", 2);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(opts.str("group"),
            new AclClientRPCHook(new SessionCredentials(cred[0], cred[1])));
        consumer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(consumer);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPollTimeoutMillis(1000);
        consumer.subscribe(topic, "*");
        consumer.start();
        long deadline = opts.deadlineMs(30);
        try {
            int received = 0;
            while (received < count && System.currentTimeMillis() < deadline) {
                for (MessageExt msg : consumer.poll(500)) {
                    Out.message("received", msg).emit();
                    received++;
                }
            }
            return received >= count ? 0 : 3;
        } finally {
            consumer.shutdown();
        }
    }
}
