package interop;

import java.util.HashMap;
import java.util.Map;

import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.producer.DefaultMQProducer;

/** Command-line options of every program: "--name value" pairs, "--flag" alone means "true". */
public final class Opts {
    /**
     * The clients' budgets, sized for a loaded machine: a client's defaults (3 s for a send and for
     * every request to a NameServer or broker) are exceeded there by a JVM started cold, and a
     * client closes its channel when a request times out, failing every other request in flight on
     * it ("send request to <addr> failed").
     */
    static final int CLIENT_TIMEOUT_MS = 15_000;

    /**
     * After a client started: the same budget for what its MQAdminImpl asks (fetchMessageQueues,
     * minOffset, maxOffset, searchOffset: 6 s, not the client's setting), through the client
     * instance the client shares with every client of its id.
     */
    static void loadedAdmin(ClientConfig client) {
        MQClientManager.getInstance().getOrCreateMQClientInstance(client).getMQAdminImpl()
            .setTimeoutMillis(CLIENT_TIMEOUT_MS);
    }

    /** Gives a client the budgets of {@link #CLIENT_TIMEOUT_MS}. */
    static void loaded(ClientConfig client) {
        client.setMqClientApiTimeout(CLIENT_TIMEOUT_MS);
        if (client instanceof DefaultMQProducer) {
            ((DefaultMQProducer) client).setSendMsgTimeout(CLIENT_TIMEOUT_MS);
        }
    }

    /**
     * After a producer started, before its first send of an existing topic: until its client
     * holds the topic's route.  The client takes its route lock with a fixed 3 s budget
     * (MQClientInstance.LOCK_TIMEOUT_MILLIS, not a setting); on a loaded machine, with the
     * client's own periodic route update holding it, a first send then finds no route and falls
     * back to TBW102's queues, which the existing topic refuses ("queueId[2] is illegal").  A
     * topic with no route yet (one the send is to create through TBW102) is not waited for.
     */
    static void routed(DefaultMQProducer producer, String topic) throws InterruptedException {
        try {
            producer.fetchPublishMessageQueues(topic); // asks the NameServer, without the lock
        } catch (Exception noRouteYet) {
            return;
        }
        long deadline = System.currentTimeMillis() + CLIENT_TIMEOUT_MS;
        while (!producer.getDefaultMQProducerImpl().getMqClientFactory()
                .updateTopicRouteInfoFromNameServer(topic)
            && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
    }

    private final Map<String, String> values = new HashMap<>();

    public Opts(String[] args, int from) {
        for (int i = from; i < args.length; i++) {
            String a = args[i];
            if (!a.startsWith("--")) {
                throw new IllegalArgumentException("expected --option, got " + a);
            }
            String name = a.substring(2);
            if (i + 1 < args.length && !args[i + 1].startsWith("--")) {
                values.put(name, args[++i]);
            } else {
                values.put(name, "true");
            }
        }
    }

    public String str(String name) {
        String v = values.get(name);
        if (v == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return v;
    }

    public String str(String name, String dflt) {
        return values.getOrDefault(name, dflt);
    }

    public int integer(String name, int dflt) {
        String v = values.get(name);
        return v == null ? dflt : Integer.parseInt(v);
    }

    public long longValue(String name, long dflt) {
        String v = values.get(name);
        return v == null ? dflt : Long.parseLong(v);
    }

    public boolean flag(String name) {
        return Boolean.parseBoolean(values.getOrDefault(name, "false"));
    }

    /** The NameServer address list ("host:port;host:port"), required by every program. */
    public String namesrv() {
        return str("namesrv");
    }

    /** A deadline this many seconds from now (--timeout-s, default dflt). */
    public long deadlineMs(int dfltSeconds) {
        return System.currentTimeMillis() + 1000L * integer("timeout-s", dfltSeconds);
    }
}
