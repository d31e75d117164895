"""Configurations of envoyproxy/ratelimit's own fixtures, copied verbatim (github.com/envoyproxy/ratelimit at
f2fb15770f7fd1c88ca6c3a1b58ee513917ace96): ``examples/ratelimit/config/example.yaml`` and
``test/config/merge_domain_key1.yaml``/``merge_domain_key2.yaml``."""

from __future__ import annotations

EXAMPLE_YAML = """\
---
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: baz
        value: not-so-shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
        shadow_mode: true
      - key: bay
        rate_limit:
          unlimited: true
  - key: unspec
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: qux
    rate_limit:
      unlimited: true
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
"""

MERGE_DOMAIN_KEY1 = """\
# Basic configuration which will be merged with `merge_domain2.yaml`
domain: test-domain
descriptors:
  # Top level key/value which is not specified in `merge_domain2.yaml`
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 10
"""

MERGE_DOMAIN_KEY2 = """\
# Basic configuration which will be merged with `merge_domain.yaml`
domain: test-domain
descriptors:
  # Top level key/value which is not specified in `merge_domain.yaml`
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 20
"""
