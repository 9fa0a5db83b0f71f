package interop;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Seed 002 ("2. Transaction message start"): the TransactionMQProducer with its check thread
 * pool as the article writes it, and seed 000's TransactionListenerImpl (from rocketmq-example):
 * every local transaction answers UNKNOW, and the broker's check-back then answers by
 * transactionIndex % 3 -- 0 UNKNOW (checked again), 1 COMMIT_MESSAGE, 2 ROLLBACK_MESSAGE.
 *
 * Sends --count messages (body "hello i"), then stays up until every message whose status is 1
 * or 2 was checked back and answered, and every status-0 message was checked at least once.
 *
 * --namesrv ADDR --group G --topic T [--count N] [--timeout-s S]
 */
final class Seed002TransactionProducer {

    /** Seed 000's listener, as written there (the generic map types added; it prints each call). */
    static class TransactionListenerImpl implements TransactionListener {
        private AtomicInteger transactionIndex = new AtomicInteger(0);

        private ConcurrentHashMap<String, Integer> localTrans = new ConcurrentHashMap<>();

        final Set<String> answered = ConcurrentHashMap.newKeySet();

        @Override
        public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            int value = transactionIndex.getAndIncrement();
            int status = value % 3;
            localTrans.put(msg.getTransactionId(), status);
            Out.event("local").put("transactionId", msg.getTransactionId()).put("index", value)
                .put("status", status).emit();
            return LocalTransactionState.UNKNOW;
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            LocalTransactionState state = check(msg);
            answered.add(msg.getTransactionId());
            Out.event("check").put("transactionId", msg.getTransactionId())
                .put("body", new String(msg.getBody(), StandardCharsets.UTF_8))
                .put("thread", Thread.currentThread().getName())
                .put("state", state.name()).emit();
            return state;
        }

        private LocalTransactionState check(MessageExt msg) {
            Integer status = localTrans.get(msg.getTransactionId());
            if (null != status) {
                switch (status) {
                    case 0:
                        return LocalTransactionState.UNKNOW;
                    case 1:
                        return LocalTransactionState.COMMIT_MESSAGE;
                    case 2:
                        return LocalTransactionState.ROLLBACK_MESSAGE;
                    default:
                        return LocalTransactionState.COMMIT_MESSAGE;
                }
            }
            return LocalTransactionState.COMMIT_MESSAGE;
        }
    }

    static int run(Opts opts) throws Exception {
        int count = opts.integer("count", 6);
        long deadline = opts.deadlineMs(60);
        TransactionListenerImpl transactionListener = new TransactionListenerImpl();
        TransactionMQProducer producer = new TransactionMQProducer(opts.str("group", "trans_producer"));
        producer.setNamesrvAddr(opts.namesrv());
        Opts.loaded(producer);
        ExecutorService executorService = new ThreadPoolExecutor(2, 5, 100, TimeUnit.SECONDS,
            new ArrayBlockingQueue<Runnable>(2000), new ThreadFactory() {
                @Override
                public Thread newThread(Runnable r) {
                    Thread thread = new Thread(r);
                    thread.setName("client-transaction-msg-check-thread");
                    return thread;
                }
            }); // The thread pool that executes the transaction listening task
        producer.setExecutorService(executorService);
        producer.setTransactionListener(transactionListener);
        producer.start();
        Opts.routed(producer, opts.str("topic"));
        try {
            Map<String, Integer> sent = new ConcurrentHashMap<>();
            for (int i = 0; i < count; i++) {
                Message msg = new Message(opts.str("topic"), "TagA", ("hello " + i).getBytes(StandardCharsets.UTF_8));
                TransactionSendResult r = producer.sendMessageInTransaction(msg, null);
                Out.sent(r).put("i", i).put("transactionId", r.getTransactionId())
                    .put("localState", r.getLocalTransactionState().name()).emit();
                sent.put(r.getTransactionId(), i);
            }
            while (System.currentTimeMillis() < deadline) {
                if (transactionListener.answered.containsAll(sent.keySet())) {
                    Thread.sleep(1000); // let the last END_TRANSACTION reach the broker
                    return 0;
                }
                Thread.sleep(100);
            }
            return 3;
        } finally {
            producer.shutdown();
            executorService.shutdownNow();
        }
    }
}
