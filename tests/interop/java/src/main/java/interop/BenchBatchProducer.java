package interop;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

/**
 * The Java side of bench/cluster_write_bench.py: --threads threads share one DefaultMQProducer and
 * send --count messages in total as batches (DefaultMQProducer.send(Collection), one
 * SEND_BATCH_MESSAGE each; the producer picks the queue round robin over every broker) of
 * --batch messages, each with a --body-bytes body, tag "bench" and a key.  A warm-up of --warmup
 * batches (not timed) comes first.  A batch the broker refuses is sent again (up to 5 times).  Prints one
 * "bench" line: messages, seconds, failures, retried batches.
 *
 * --namesrv ADDR --group G --topic T [--count N] [--threads K] [--batch B] [--body-bytes S] [--warmup W]
 */
final class BenchBatchProducer {
    static int run(Opts opts) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group"));
        producer.setNamesrvAddr(opts.namesrv());
        producer.start();
        try {
            String topic = opts.str("topic");
            byte[] body = new byte[opts.integer("body-bytes", 100)];
            java.util.Arrays.fill(body, (byte) 'x');
            int batch = opts.integer("batch", 1000);
            for (int i = 0; i < opts.integer("warmup", 5); i++) {
                producer.send(batchOf(topic, body, 0, batch));
            }
            int count = opts.integer("count", 1000000);
            int threads = opts.integer("threads", 4);
            AtomicLong next = new AtomicLong();
            AtomicLong failed = new AtomicLong();
            AtomicLong retried = new AtomicLong();
            List<Thread> workers = new ArrayList<>();
            long t0 = System.nanoTime();
            for (int k = 0; k < threads; k++) {
                Thread t = new Thread(() -> {
                    while (true) {
                        long first = next.getAndAdd(batch);
                        if (first >= count) {
                            break;
                        }
                        int n = (int) Math.min(batch, count - first);
                        List<Message> msgs = batchOf(topic, body, first, n);
                        boolean ok = false;
                        // a batch refused (e.g. the broker's flow control, SYSTEM_BUSY) is sent
                        // again, up to 5 times, as an application would
                        for (int attempt = 0; attempt < 5 && !ok; attempt++) {
                            try {
                                SendResult r = producer.send(msgs);
                                ok = r.getSendStatus() == SendStatus.SEND_OK;
                            } catch (Exception e) {
                                retried.incrementAndGet();
                                try {
                                    Thread.sleep(100L * (attempt + 1));
                                } catch (InterruptedException ie) {
                                    Thread.currentThread().interrupt();
                                    return;
                                }
                            }
                        }
                        if (!ok) {
                            failed.addAndGet(n);
                        }
                    }
                });
                t.start();
                workers.add(t);
            }
            for (Thread t : workers) {
                t.join();
            }
            double seconds = (System.nanoTime() - t0) / 1e9;
            Out.event("bench").put("messages", count).put("seconds", seconds).put("failed", failed.get())
                .put("retried", retried.get()).emit();
        } finally {
            producer.shutdown();
        }
        return 0;
    }

    private static List<Message> batchOf(String topic, byte[] body, long first, int n) {
        List<Message> msgs = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            msgs.add(new Message(topic, "bench", "k" + (first + i), body));
        }
        return msgs;
    }
}
