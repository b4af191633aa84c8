"""Outbound configs shown by the API carry no secret: not in URL query strings, not under
credential-like keys (``sign``, ``api_key``, ``Cookie``...)."""

from __future__ import annotations

from .conftest import MakeApi

SECRETS = ("sgn-5d1e", "tok-9a7b", "key-4c2f", "ck-0e9d", "pw-7f3a")


async def test_outbound_configs_mask_query_secrets_and_credential_keys(make_api: MakeApi) -> None:
    api = await make_api(outbound=[{
        "name": "default",
        "init": {
            "key": "default",
            "sign": "sgn-5d1e",
            "callback": "https://cb.example.test/hook?access_token=tok-9a7b&page=1",
            "headers": {"X-Api-Key": "key-4c2f", "Cookie": "sid=ck-0e9d", "Accept": "json"},
            "mirror": "redis://:pw-7f3a@127.0.0.1:6379/0",
        },
    }])
    for path in ("/outbound/", "/outbound/default"):
        r = await api.client.get(path)
        assert r.status_code == 200
        for secret in SECRETS:
            assert secret not in r.text, (path, secret)
        assert "access_token=***&page=1" in r.text
        assert '"key":"default"' in r.text.replace(" ", "")
