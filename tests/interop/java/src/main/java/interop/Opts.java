package interop;

import java.util.HashMap;
import java.util.Map;

/** Command-line options of every program: "--name value" pairs, "--flag" alone means "true". */
public final class Opts {
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
