package interop;

import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Finding messages without consuming them:
 *  - viewMessage(topic, offsetMsgId): the id encodes the broker address and CommitLog offset
 *    (VIEW_MESSAGE_BY_ID);
 *  - viewMessage(topic, msgId): the client's unique id, looked up in the broker's index
 *    (QUERY_MESSAGE by unique key);
 *  - queryMessage(topic, key, ...): the index by message key (QUERY_MESSAGE), on every broker.
 * The index is built asynchronously, so lookups are retried until --timeout-s.
 *
 * --namesrv ADDR --group G --topic T [--offset-msg-id ID] [--msg-id ID] [--key K] [--max N]
 */
final class Lookup {
    @SuppressWarnings("deprecation")
    static int run(Opts opts) throws Exception {
        String topic = opts.str("topic");
        long deadline = opts.deadlineMs(20);
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group"));
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        producer.start();
        try {
            if (opts.str("offset-msg-id", null) != null) {
                MessageExt msg = producer.viewMessage(topic, opts.str("offset-msg-id"));
                Out.message("viewed", msg).put("by", "offsetMsgId").emit();
            }
            if (opts.str("msg-id", null) != null) {
                MessageExt msg = retry(deadline, () -> producer.viewMessage(topic, opts.str("msg-id")));
                Out.message("viewed", msg).put("by", "msgId").emit();
            }
            if (opts.str("key", null) != null) {
                int max = opts.integer("max", 32);
                QueryResult result = retry(deadline, () -> {
                    QueryResult r = producer.queryMessage(topic, opts.str("key"), max, 0, Long.MAX_VALUE);
                    if (r.getMessageList().isEmpty()) {
                        throw new IllegalStateException("no message with key " + opts.str("key"));
                    }
                    return r;
                });
                for (MessageExt msg : result.getMessageList()) {
                    Out.message("queried", msg).put("by", "key").emit();
                }
            }
        } finally {
            producer.shutdown();
        }
        return 0;
    }

    interface Call<T> {
        T call() throws Exception;
    }

    static <T> T retry(long deadline, Call<T> call) throws Exception {
        while (true) {
            try {
                return call.call();
            } catch (Exception e) {
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
                Thread.sleep(200);
            }
        }
    }
}
