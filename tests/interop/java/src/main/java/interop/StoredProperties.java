package interop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The properties a broker stores for each kind of operation (issue 29 item 3), one workload:
 * a plain send, a delay-level message (level 1), a timer message (TIMER_DELIVER_MS = now + 2 s,
 * set with MessageAccessor so that both clients compile it), a committed transactional message,
 * and two plain messages that a pull consumer sends back: "retry" with delay level 1 (to
 * %RETRY%group), "dlq" with delay level -1 (straight to %DLQ%group).  Then it pulls the topic,
 * the retry and the DLQ topics (every broker of the route, queue 0 of the last two) until every
 * stored message is there, and prints each as a "stored" event: every property as the broker
 * returned the record, plus storeHost, commitLogOffset and sysFlag.
 *
 * --namesrv ADDR --group G --topic T [--timeout-s S]
 */
@SuppressWarnings("deprecation")
final class StoredProperties {
    static int run(Opts opts) throws Exception {
        String topic = opts.str("topic");
        String group = opts.str("group");
        long deadline = opts.deadlineMs(60);

        DefaultMQProducer producer = new DefaultMQProducer(group + "_p");
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        producer.start();
        Opts.routed(producer, topic);
        TransactionMQProducer txProducer = new TransactionMQProducer(group + "_tx");
        txProducer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(txProducer);
        txProducer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        txProducer.start();
        Opts.routed(txProducer, topic);
        DefaultMQPullConsumer consumer = new DefaultMQPullConsumer(group);
        consumer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(consumer);
        consumer.start();
        try {
            for (String kind : new String[] {"plain", "delay", "timer", "retry", "dlq"}) {
                Message msg = new Message(topic, "Tag" + kind, "key-" + kind, kind.getBytes(StandardCharsets.UTF_8));
                msg.putUserProperty("kind", kind);
                if (kind.equals("delay")) {
                    msg.setDelayTimeLevel(1);
                } else if (kind.equals("timer")) {
                    MessageAccessor.putProperty(msg, "TIMER_DELIVER_MS", String.valueOf(System.currentTimeMillis() + 2000));
                }
                SendResult r = producer.send(msg);
                Out.sent(r).put("kind", kind).emit();
            }
            Message txMsg = new Message(topic, "Tagtxn", "key-txn", "txn".getBytes(StandardCharsets.UTF_8));
            txMsg.putUserProperty("kind", "txn");
            SendResult tr = txProducer.sendMessageInTransaction(txMsg, null);
            Out.sent(tr).put("kind", "txn").put("localState", ((org.apache.rocketmq.client.producer.TransactionSendResult) tr)
                .getLocalTransactionState().name()).emit();

            // the originals of "retry" and "dlq", pulled and sent back
            Set<String> sentBack = new LinkedHashSet<>();
            Set<String> brokers = new LinkedHashSet<>();
            while (sentBack.size() < 2 && System.currentTimeMillis() < deadline) {
                for (MessageExt msg : pullAll(consumer, consumer.fetchSubscribeMessageQueues(topic), brokers)) {
                    String kind = msg.getUserProperty("kind");
                    if (("retry".equals(kind) || "dlq".equals(kind)) && sentBack.add(kind)) {
                        consumer.sendMessageBack(msg, "retry".equals(kind) ? 1 : -1, msg.getBrokerName());
                        Out.event("sent-back").put("kind", kind).emit();
                    }
                }
                Thread.sleep(200);
            }

            // everything stored: 6 in the topic (delay and timer delivered), one each in retry and DLQ
            Map<String, MessageExt> stored = new HashMap<>();
            while (System.currentTimeMillis() < deadline) {
                stored.clear();
                List<MessageQueue> mqs = new ArrayList<>(consumer.fetchSubscribeMessageQueues(topic));
                for (String broker : brokers) {
                    mqs.add(new MessageQueue("%RETRY%" + group, broker, 0));
                    mqs.add(new MessageQueue("%DLQ%" + group, broker, 0));
                }
                for (MessageExt msg : pullAll(consumer, mqs, brokers)) {
                    String where = msg.getTopic().startsWith("%RETRY%") ? "retry-topic"
                        : msg.getTopic().startsWith("%DLQ%") ? "dlq-topic" : "topic";
                    stored.put(where + "/" + msg.getUserProperty("kind"), msg);
                }
                if (stored.size() >= 8) {
                    break;
                }
                Thread.sleep(300);
            }
            for (Map.Entry<String, MessageExt> e : stored.entrySet()) {
                MessageExt msg = e.getValue();
                Out.message("stored", msg).put("where", e.getKey())
                    .put("storeHost", String.valueOf(msg.getStoreHost()))
                    .put("commitLogOffset", msg.getCommitLogOffset())
                    .put("sysFlag", msg.getSysFlag()).emit();
            }
            return stored.size() >= 8 ? 0 : 3;
        } finally {
            consumer.shutdown();
            txProducer.shutdown();
            producer.shutdown();
        }
    }

    /** Every message of ``mqs`` from its min offset (a queue the broker does not have: none). */
    private static List<MessageExt> pullAll(DefaultMQPullConsumer consumer, java.util.Collection<MessageQueue> mqs,
                                            Set<String> brokers) {
        List<MessageExt> out = new ArrayList<>();
        for (MessageQueue mq : mqs) {
            brokers.add(mq.getBrokerName());
            try {
                long offset = consumer.minOffset(mq);
                long max = consumer.maxOffset(mq);
                int pulls = 0;
                while (offset < max && pulls++ < 100) {
                    PullResult result = consumer.pull(mq, "*", offset, 32);
                    if (result.getMsgFoundList() != null) {
                        for (MessageExt msg : result.getMsgFoundList()) {
                            msg.setBrokerName(mq.getBrokerName());
                            out.add(msg);
                        }
                    }
                    if (result.getNextBeginOffset() <= offset) {
                        break;
                    }
                    offset = result.getNextBeginOffset();
                }
            } catch (Exception e) {
                // a retry or DLQ topic this broker does not have (yet)
            }
        }
        return out;
    }
}
