package interop;

import java.util.ArrayList;
import java.util.List;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The read benchmark of bench/cluster_bench.py: a DefaultLitePullConsumer assigned every queue of
 * the topic on every broker, each sought to its first offset, polling until --count messages
 * arrived (bodies touched, so they are really decoded).  Timed from start() (routes, offsets
 * and pulls included, as Spark's read is timed from planning) to the last message.  Prints one
 * "bench" line: messages, seconds, bytes.
 *
 * --namesrv ADDR --group G --topic T --count N [--pull-batch B] [--pull-threads K] [--timeout-s S]
 */
final class BenchLitePullConsumer {
    static int run(Opts opts) throws Exception {
        String topic = opts.str("topic");
        long count = opts.integer("count", 1000000);
        long deadline = opts.deadlineMs(600);
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(opts.str("group"));
        consumer.setNamesrvAddr(opts.namesrv());
        consumer.setAutoCommit(false);
        consumer.setPullBatchSize(opts.integer("pull-batch", 32));
        consumer.setPullThreadNums(opts.integer("pull-threads", 20));
        consumer.setPollTimeoutMillis(1000);
        long t0 = System.nanoTime();
        consumer.start();
        long received = 0;
        long bytes = 0;
        try {
            List<MessageQueue> queues = new ArrayList<>(consumer.fetchMessageQueues(topic));
            consumer.assign(queues);
            for (MessageQueue mq : queues) {
                consumer.seekToBegin(mq);
            }
            while (received < count) {
                if (System.currentTimeMillis() > deadline) {
                    Out.event("timeout").put("messages", received).emit();
                    return 3;
                }
                for (MessageExt m : consumer.poll()) {
                    bytes += m.getBody().length;
                    received++;
                }
            }
            double seconds = (System.nanoTime() - t0) / 1e9;
            Out.event("bench").put("messages", received).put("seconds", seconds).put("bytes", bytes).emit();
        } finally {
            consumer.shutdown();
        }
        return 0;
    }
}
