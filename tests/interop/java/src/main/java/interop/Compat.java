package interop;

import java.lang.reflect.Method;

/**
 * The one API difference between the 4.9.x and 5.x clients these programs meet: MessageModel
 * moved from org.apache.rocketmq.common.protocol.heartbeat to
 * org.apache.rocketmq.remoting.protocol.heartbeat.  Set by name through the setter's parameter
 * type, so one source tree compiles against both.
 */
final class Compat {
    private Compat() {}

    @SuppressWarnings({"unchecked", "rawtypes"})
    static void setMessageModel(Object consumer, String name) throws Exception {
        for (Method m : consumer.getClass().getMethods()) {
            if (m.getName().equals("setMessageModel") && m.getParameterCount() == 1) {
                Class type = m.getParameterTypes()[0];
                m.invoke(consumer, Enum.valueOf(type, name));
                return;
            }
        }
        throw new NoSuchMethodException(consumer.getClass().getName() + ".setMessageModel");
    }
}
