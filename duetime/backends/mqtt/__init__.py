"""MQTT 5: a transport that publishes each message with QoS 1 to the topic its destination names."""
