def test_package_layout():
    import mooncake
    import mooncake.tools
    assert mooncake.tools.__name__ == "mooncake.tools"
