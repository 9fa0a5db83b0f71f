package interop;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Entry point: {@code interop.Main PROGRAM --namesrv HOST:PORT [--option value ...]}.
 *
 * Every program prints one JSON object per line (see {@link Out}), ends by itself (bounded loops
 * and --timeout-s), and exits 0 on success, 1 on an exception and 3 when it timed out before
 * seeing what it expected.  System.exit ends the clients' non-daemon threads.
 */
public final class Main {
    /** A program: runs, returns the exit code. */
    interface Program {
        int run(Opts opts) throws Exception;
    }

    static final Map<String, Program> PROGRAMS = new LinkedHashMap<>();

    static {
        PROGRAMS.put("seed000-delay-producer", Seed000DelayProducer::run);
        PROGRAMS.put("seed000-delay-consumer", Seed000DelayConsumer::run);
        PROGRAMS.put("seed002-transaction-producer", Seed002TransactionProducer::run);
        PROGRAMS.put("seed004-producer", Seed004Producer::run);
        PROGRAMS.put("seed001-push-consumer", PushConsumer::run);
        PROGRAMS.put("seed001-pull-consumer", PullConsumer::run);
        PROGRAMS.put("producer", Producer::run);
        PROGRAMS.put("lite-pull-consumer", LitePullConsumer::run);
        PROGRAMS.put("offsets", Offsets::run);
        PROGRAMS.put("lookup", Lookup::run);
        PROGRAMS.put("stored-properties", StoredProperties::run);
        PROGRAMS.put("acl-clients", AclClients::run);
        PROGRAMS.put("bench-producer", BenchProducer::run);
        PROGRAMS.put("bench-batch-producer", BenchBatchProducer::run);
        PROGRAMS.put("bench-consumer", BenchConsumer::run);
        PROGRAMS.put("bench-lite-pull-consumer", BenchLitePullConsumer::run);
        PROGRAMS.put("mqadmin", opts -> 2); // handled in main(): its arguments are mqadmin's own
    }

    public static void main(String[] args) {
        int code;
        if (args.length == 0 || !PROGRAMS.containsKey(args[0])) {
            System.err.println("usage: interop.Main PROGRAM --namesrv ADDR ...; programs: " + PROGRAMS.keySet());
            System.exit(2);
        }
        if ("mqadmin".equals(args[0])) {
            // mqadmin's own arguments ("clusterList -n ADDR"), passed through as they are
            code = Admin.run(Arrays.copyOfRange(args, 1, args.length));
            System.exit(code);
        }
        try {
            code = PROGRAMS.get(args[0]).run(new Opts(args, 1));
        } catch (Throwable t) {
            Out.event("error").put("type", t.getClass().getName()).put("message", String.valueOf(t.getMessage())).emit();
            t.printStackTrace();
            code = 1;
        }
        Out.event("exit").put("code", code).emit();
        System.exit(code);
    }
}
