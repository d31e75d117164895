"""The configuration examples of envoyproxy/ratelimit's README ("Configuration" > "Examples"), copied
verbatim (github.com/envoyproxy/ratelimit, README.md at f2fb15770f7fd1c88ca6c3a1b58ee513917ace96)."""

from __future__ import annotations

EXAMPLE_1 = """\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
"""

EXAMPLE_2 = """\
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"""

EXAMPLE_3 = """\
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"""

EXAMPLE_4_FLAT = """\
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
"""

EXAMPLE_4_NESTED = """\
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
"""

EXAMPLE_5 = """\
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"""

EXAMPLE_6 = """\
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
"""

EXAMPLE_7 = """\
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"""

EXAMPLE_8 = """\
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
"""

EXAMPLE_9_TRAILING = """\
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
"""

EXAMPLE_9_MIDDLE = """\
domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"""

EXAMPLE_9_MULTIPLE = """\
domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"""

EXAMPLE_10 = """\
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
"""

EXAMPLE_10_WILDCARD = """\
domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
"""

EXAMPLE_11 = """\
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"""

EXAMPLE_11_METRICS = """\
domain: example11_metrics
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
"""

ALL = {
    "EXAMPLE_1": EXAMPLE_1,
    "EXAMPLE_2": EXAMPLE_2,
    "EXAMPLE_3": EXAMPLE_3,
    "EXAMPLE_4_FLAT": EXAMPLE_4_FLAT,
    "EXAMPLE_4_NESTED": EXAMPLE_4_NESTED,
    "EXAMPLE_5": EXAMPLE_5,
    "EXAMPLE_6": EXAMPLE_6,
    "EXAMPLE_7": EXAMPLE_7,
    "EXAMPLE_8": EXAMPLE_8,
    "EXAMPLE_9_TRAILING": EXAMPLE_9_TRAILING,
    "EXAMPLE_9_MIDDLE": EXAMPLE_9_MIDDLE,
    "EXAMPLE_9_MULTIPLE": EXAMPLE_9_MULTIPLE,
    "EXAMPLE_10": EXAMPLE_10,
    "EXAMPLE_10_WILDCARD": EXAMPLE_10_WILDCARD,
    "EXAMPLE_11": EXAMPLE_11,
    "EXAMPLE_11_METRICS": EXAMPLE_11_METRICS,
}
