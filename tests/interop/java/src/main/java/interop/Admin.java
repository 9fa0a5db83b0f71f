package interop;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import org.apache.rocketmq.tools.command.MQAdminStartup;

/**
 * The real mqadmin (rocketmq-tools' MQAdminStartup), given its own arguments as they are:
 * {@code interop.Main mqadmin clusterList -n HOST:PORT}.  Its output is mqadmin's text; the
 * program exits when the command returns.
 *
 * The 4.9.x mqadmin refuses to run without ${rocketmq.home}/conf/logback_tools.xml (it prints a
 * JoranException and does nothing); a minimal one that logs nothing is written there if absent.
 */
final class Admin {
    static int run(String[] args) {
        try {
            writeLogbackConfig();
        } catch (IOException e) {
            e.printStackTrace();
            return 1;
        }
        MQAdminStartup.main0(args, null);
        System.out.flush();
        return 0;
    }

    private static void writeLogbackConfig() throws IOException {
        String home = System.getProperty("rocketmq.home.dir", System.getenv("ROCKETMQ_HOME"));
        if (home == null) {
            return;
        }
        Path conf = Path.of(home, "conf", "logback_tools.xml");
        if (!Files.exists(conf)) {
            Files.createDirectories(conf.getParent());
            Files.write(conf, "<configuration><root level=\"WARN\"/></configuration>\n".getBytes(StandardCharsets.UTF_8));
        }
    }
}
