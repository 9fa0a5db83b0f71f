package interop;

import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.client.producer.SendResult;

/**
 * The programs' only output channel: one JSON object per line on stdout, which pytest parses
 * (tests/interop/_java.py).  Every line has "event"; the other fields depend on the event.
 * Written by hand (a few lines) so that the programs need nothing beyond rocketmq-client.
 */
public final class Out {
    private Out() {}

    /** Starts an event line: Out.event("received").put("body", ...).emit(). */
    public static Line event(String name) {
        return new Line().put("event", name);
    }

    /** The fields every "received" event carries, from a consumed message. */
    public static Line message(String name, MessageExt msg) {
        Line line = event(name)
            .put("topic", msg.getTopic())
            .put("tags", msg.getTags())
            .put("keys", msg.getKeys())
            .put("body", new String(msg.getBody(), StandardCharsets.UTF_8))
            .put("msgId", msg.getMsgId())
            // the store's id of the record (MessageDecoder.createMessageId: its store host and
            // CommitLog offset), which a pulled MessageClientExt keeps beside the UNIQ_KEY
            .put("offsetMsgId", msg instanceof MessageClientExt ? ((MessageClientExt) msg).getOffsetMsgId() : null)
            .put("commitLogOffset", msg.getCommitLogOffset())
            .put("brokerName", msg.getBrokerName())
            .put("queueId", msg.getQueueId())
            .put("queueOffset", msg.getQueueOffset())
            .put("bornTimestamp", msg.getBornTimestamp())
            .put("storeTimestamp", msg.getStoreTimestamp())
            .put("reconsumeTimes", msg.getReconsumeTimes())
            .put("receivedAt", System.currentTimeMillis());
        Map<String, Object> props = new LinkedHashMap<>();
        for (Map.Entry<String, String> e : msg.getProperties().entrySet()) {
            props.put(e.getKey(), e.getValue());
        }
        return line.put("properties", props);
    }

    /** The fields of a SendResult. */
    public static Line sent(SendResult r) {
        return event("sent")
            .put("status", r.getSendStatus().name())
            .put("msgId", r.getMsgId())
            .put("offsetMsgId", r.getOffsetMsgId())
            .put("brokerName", r.getMessageQueue().getBrokerName())
            .put("queueId", r.getMessageQueue().getQueueId())
            .put("queueOffset", r.getQueueOffset())
            .put("sentAt", System.currentTimeMillis());
    }

    /** One JSON object, fields in insertion order. */
    public static final class Line {
        private final Map<String, Object> fields = new LinkedHashMap<>();

        public Line put(String key, Object value) {
            fields.put(key, value);
            return this;
        }

        public void emit() {
            String text = encode(fields);
            synchronized (System.out) {
                System.out.println(text);
                System.out.flush();
            }
        }
    }

    static String encode(Object value) {
        StringBuilder sb = new StringBuilder();
        write(sb, value);
        return sb.toString();
    }

    @SuppressWarnings("unchecked")
    private static void write(StringBuilder sb, Object value) {
        if (value == null) {
            sb.append("null");
        } else if (value instanceof Number || value instanceof Boolean) {
            sb.append(value);
        } else if (value instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : ((Map<String, Object>) value).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                writeString(sb, e.getKey());
                sb.append(':');
                write(sb, e.getValue());
            }
            sb.append('}');
        } else if (value instanceof Iterable) {
            sb.append('[');
            boolean first = true;
            for (Object item : (Iterable<Object>) value) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, item);
            }
            sb.append(']');
        } else {
            writeString(sb, value.toString());
        }
    }

    private static void writeString(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
            }
        }
        sb.append('"');
    }
}
