package interop;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

/**
 * The send benchmark of bench/remoting_bench.py: --threads threads share one DefaultMQProducer and
 * send --count messages in total, synchronously, each with a --body-bytes body.  A warm-up of
 * --warmup sends (not timed) comes first.  Prints one "bench" line: messages, seconds, failures.
 *
 * --namesrv ADDR --group G --topic T [--count N] [--threads K] [--body-bytes B] [--warmup W]
 */
final class BenchProducer {
    static int run(Opts opts) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(opts.str("group"));
        producer.setNamesrvAddr(opts.namesrv());
        producer.start();
        try {
            String topic = opts.str("topic");
            byte[] body = new byte[opts.integer("body-bytes", 100)];
            java.util.Arrays.fill(body, (byte) 'x');
            for (int i = 0; i < opts.integer("warmup", 500); i++) {
                producer.send(new Message(topic, "bench", body));
            }
            int count = opts.integer("count", 20000);
            int threads = opts.integer("threads", 8);
            AtomicLong left = new AtomicLong(count);
            AtomicLong failed = new AtomicLong();
            List<Thread> workers = new ArrayList<>();
            long t0 = System.nanoTime();
            for (int k = 0; k < threads; k++) {
                Thread t = new Thread(() -> {
                    while (left.getAndDecrement() > 0) {
                        try {
                            SendResult r = producer.send(new Message(topic, "bench", body));
                            if (r.getSendStatus() != SendStatus.SEND_OK) {
                                failed.incrementAndGet();
                            }
                        } catch (Exception e) {
                            failed.incrementAndGet();
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
            Out.event("bench").put("messages", count).put("seconds", seconds).put("failed", failed.get()).emit();
        } finally {
            producer.shutdown();
        }
        return 0;
    }
}
